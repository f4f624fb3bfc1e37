// The official openai Node client as an application of the sidecar's
// /v1/responses: it streams one response and accumulates it with
// finalResponse(), which throws on a stream the API would never send (an
// event type it does not know, an output index with a gap, a delta before
// its item or part, an event before response.created). It prints the
// final response's text, status, function calls and usage as JSON.
//
//   node check-responses.mjs <base URL> <user message> [<tools as JSON>]
import OpenAI from "openai";

const [baseURL, user, tools] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "app-key", maxRetries: 0 });
const stream = client.responses.stream({
  model: "sim-model",
  input: user,
  reasoning: { effort: "low" },
  ...(tools && tools !== "[]" ? { tools: JSON.parse(tools) } : {}),
});
const done = await stream.finalResponse();
console.log(JSON.stringify({
  id: done.id,
  text: done.output_text,
  status: done.status,
  calls: done.output.filter((it) => it.type === "function_call"),
  usage: done.usage,
}));
