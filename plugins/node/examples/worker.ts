/**
 * An example Node worker: serves get_hotel_rates on the sidecar's bus.
 *
 *   NATS_URL=nats://127.0.0.1:4222 NATS_USER=hotels NATS_PASSWORD=... node dist/examples/worker.js
 *
 * NATS_USER and NATS_PASSWORD are the worker's user on the sidecar's
 * embedded server (nats.embedded.workers); leave them unset on a server
 * that needs no credentials.
 */
import { connect } from "@nats-io/transport-node";
import { serve, ToolError, type Call } from "../src/index.js";

async function getHotelRates(call: Call) {
  const args = call.args as { city?: string; nights?: number };
  if (!args.city) throw new ToolError("invalid_args", "city is required");
  return { city: args.city, nights: args.nights ?? 1, rates: [{ hotel: "Pod 51", usd: 129 }], served_by: "node" };
}

const nc = await connect({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  name: "example-node-worker",
  user: process.env.NATS_USER,
  pass: process.env.NATS_PASSWORD,
});
const worker = await serve(nc, { get_hotel_rates: getHotelRates }, { prefix: process.env.TOOLSIDECAR_PREFIX });
await nc.flush();
console.log("ready");

for (const sig of ["SIGTERM", "SIGINT"] as const) {
  process.once(sig, async () => {
    await worker.stop();
    await nc.drain();
    process.exit(0);
  });
}
