// The official openai Node client (7.x, which has the Agents API) as the
// application of a hosted OpenAI Agents session through the sidecar
// (agentsup's tests run it): it creates a session whose input is argv[3],
// follows the session's events through the sidecar until the turn ends,
// and prints what it saw as JSON: the session's id, the types of the
// events, the sidecar's toolsidecar.tool_result events and the session's
// status at the end.
import OpenAI from 'openai7';

const [base, input] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-app', maxRetries: 0 });
const session = await client.beta.agents.sessions.create({
  agent: {
    model: 'gpt-sim',
    tools: [{ type: 'function', name: 'a', description: 'a tool the sidecar runs', parameters: { type: 'object' } }],
  },
  environment: { type: 'none' },
  input,
});
const types = [];
const told = [];
const stream = await client.beta.agents.sessions.events.stream(session.id);
// The sidecar adds its results to this stream from the moment it opened:
// the test holds the call until then.
console.error('stream open');
let ended = false;
for await (const ev of stream) {
  types.push(ev.type);
  if (ev.type === 'toolsidecar.tool_result') told.push(ev);
  if (ev.type === 'agent.session.turn.completed') ended = true;
  if (ended && ev.type === 'agent.session.idle') break;
  if (ev.type === 'agent.session.failed') break;
}
const after = await client.beta.agents.sessions.retrieve(session.id);
console.log(JSON.stringify({ session: session.id, types, told, status: after.status }));
