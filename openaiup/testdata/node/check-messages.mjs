// The official @anthropic-ai/sdk Node client as the application: it
// streams one message from the sidecar's /v1/messages and accumulates it
// with finalMessage(), which throws on a stream the API would never send
// (an event before message_start, a delta for a block that did not
// start, no message_stop). It prints the final message's text, stop
// reason, tool_use blocks and usage as JSON.
//
//   node check-messages.mjs <base URL> <user message> [<tools as JSON>]
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, user, tools] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "app-key", maxRetries: 0 });
const stream = client.messages.stream({
  model: "sim-model",
  max_tokens: 2048,
  thinking: { type: "enabled", budget_tokens: 1024 },
  messages: [{ role: "user", content: user }],
  ...(tools && tools !== "[]" ? { tools: JSON.parse(tools) } : {}),
});
const done = await stream.finalMessage();
console.log(JSON.stringify({
  id: done.id,
  text: done.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
  stop_reason: done.stop_reason,
  tool_uses: done.content.filter((b) => b.type === "tool_use"),
  usage: done.usage,
}));
