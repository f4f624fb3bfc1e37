/**
 * An example Node worker: declares get_hotel_rates in its code (a zod
 * schema; a plain JSON Schema object serves as well) and serves it on the
 * sidecar's bus. The sidecar discovers it: no configuration entry is needed.
 *
 *   node dist/examples/worker.js
 *
 * Beside a sidecar on its defaults it needs nothing more: connectOptions()
 * reads the credentials the sidecar's embedded NATS server issued. Else
 * TOOLSIDECAR_WORKER_CREDENTIALS names that file (the sidecar logs its
 * path), or NATS_URL, NATS_USER and NATS_PASSWORD name a server and a user.
 */
import { z } from "zod";
import { connect, serve, tool } from "../src/index.js";

const HotelQuery = z.object({
  city: z.string().min(1).describe("the city"),
  nights: z.number().int().min(1).max(30).default(1),
});

const getHotelRates = tool(
  { name: "get_hotel_rates", description: "Hotel rates in a city", parameters: HotelQuery, sideEffects: "read_only" },
  // The arguments arrive parsed by the schema, its defaults filled in.
  async (call: { args: z.infer<typeof HotelQuery> }) => ({
    city: call.args.city,
    nights: call.args.nights,
    rates: [{ hotel: "Pod 51", usd: 129 }],
    served_by: "node",
  }),
);

// A wrong URL or missing credentials: the error says why and what to
// check, in one line.
const nc = await connect({ name: "example-node-worker" }).catch((e: Error) => {
  console.error(e.message);
  process.exit(1);
});
const ac = new AbortController();
for (const sig of ["SIGTERM", "SIGINT"] as const) process.once(sig, () => ac.abort());
const worker = await serve(nc, [getHotelRates], { prefix: process.env.TOOLSIDECAR_PREFIX, signal: ac.signal });
console.log("ready");
await worker.stopped; // serving until a signal
await nc.drain();
