/**
 * An example Node worker: serves get_hotel_rates on the sidecar's bus.
 *
 *   node dist/examples/worker.js
 *
 * Beside a sidecar on its defaults it needs nothing more: connectOptions()
 * reads the credentials the sidecar's embedded NATS server issued. Else
 * TOOLSIDECAR_WORKER_CREDENTIALS names that file (the sidecar logs its
 * path), or NATS_URL, NATS_USER and NATS_PASSWORD name a server and a user.
 */
import { connect } from "@nats-io/transport-node";
import { connectOptions, serve, ToolError, type Call } from "../src/index.js";

async function getHotelRates(call: Call) {
  const args = call.args as { city?: string; nights?: number };
  if (!args.city) throw new ToolError("invalid_args", "city is required");
  return { city: args.city, nights: args.nights ?? 1, rates: [{ hotel: "Pod 51", usd: 129 }], served_by: "node" };
}

const nc = await connect({ ...connectOptions(), name: "example-node-worker" });
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
