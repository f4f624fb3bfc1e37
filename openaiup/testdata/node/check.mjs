// The official openai Node client as the application: it streams one chat
// completion from the sidecar and accumulates it with
// finalChatCompletion(), which throws on a stream the API would never
// send (no finish_reason, no role, a call without its type, name or
// arguments). It prints the final message as JSON.
//
//   node check.mjs <base URL> <user message> [<tools as JSON>]
import OpenAI from "openai";

const [baseURL, user, tools] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "app-key", maxRetries: 0 });
const stream = client.chat.completions.stream({
  model: "sim-model",
  messages: [{ role: "user", content: user }],
  stream_options: { include_usage: true },
  ...(tools && tools !== "[]" ? { tools: JSON.parse(tools) } : {}),
});
const done = await stream.finalChatCompletion();
const choice = done.choices[0];
console.log(JSON.stringify({
  id: done.id,
  content: choice.message.content,
  finish_reason: choice.finish_reason,
  tool_calls: choice.message.tool_calls ?? [],
  usage: done.usage,
}));
