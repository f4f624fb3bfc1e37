// The official @anthropic-ai/sdk client as the application of a hosted
// Managed Agents session through the sidecar (agentsup's tests run it):
// it creates an agent and a session whose first message is argv[3],
// follows the session's stream through the sidecar until the turn ends,
// and prints what it saw as JSON: the session's id, the types of the
// events, the sidecar's toolsidecar.tool_result events and the answer.
import Anthropic from '@anthropic-ai/sdk';

const [base, input] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: 'sk-app', maxRetries: 0 });
const agent = await client.beta.agents.create({
  name: 'support', model: 'claude-sim',
  tools: [{ type: 'custom', name: 'a', description: 'a tool the sidecar runs', input_schema: { type: 'object' } }],
});
const session = await client.beta.sessions.create({
  agent: agent.id, environment_id: 'env_1',
  initial_events: [{ type: 'user.message', content: [{ type: 'text', text: input }] }],
});
const types = [];
const told = [];
const stream = await client.beta.sessions.events.stream(session.id);
// The sidecar adds its results to this stream from the moment it opened:
// the test holds the call until then.
console.error('stream open');
for await (const ev of stream) {
  types.push(ev.type);
  if (ev.type === 'toolsidecar.tool_result') told.push(ev);
  if (ev.type === 'session.status_idle' && ev.stop_reason?.type === 'end_turn') break;
}
let answer = '';
for await (const ev of client.beta.sessions.events.list(session.id)) {
  if (ev.type === 'agent.message') answer = ev.content.map((b) => b.text).join('');
}
console.log(JSON.stringify({ session: session.id, types, told, answer }));
