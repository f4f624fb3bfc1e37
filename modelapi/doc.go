// Package modelapi is the wire of the model APIs the sidecar serves to
// applications and calls upstream (Chat Completions, Anthropic Messages,
// OpenAI Responses), as core is Core's. It holds no run: the run that
// uses it is openaiup's.
//
// One request of an application goes through it in this order:
//
//  1. [CodecOf] names the API's [Codec]; its ReadRequest reads the
//     application's request into a [Request], the sidecar's tools added.
//  2. Each turn's body is the codec's TurnBody, posted by [Client.Post],
//     which retries what the API says may succeed later and returns any
//     other refusal as a [RefusedError].
//  3. A [Parser] reads the turn's stream, event after event, into
//     [Piece]s: text, reasoning, fragments of calls ([CallDelta]), the
//     finish. Once the caller has made the calls whole ([Call]), the
//     parser writes the turn's assistant message, replayed unchanged.
//  4. The codec's FollowUp is the turn with its calls' [Output]s, in
//     call order, for the next turn; a turn that also called the
//     application's tools is parked ([ParkedTurn]) and put back into the
//     application's next request by Restore.
//  5. The application's answer is the API's ([API.NewAnswer]), whole or
//     streamed as its official clients accumulate it, and its error
//     bodies [API.WriteError]'s.
package modelapi
