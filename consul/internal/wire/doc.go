// Package wire carries the catalog store's requests to Consul and its
// answers back: the lean types the reads of owned state and the
// transactions decode into, their JSON codec (decode and jscan for the
// answers, AppendOp for a transaction's ops, each giving exactly what
// encoding/json gives) and the raw HTTP that sends them as consul/api
// would (Raw, API).
//
// Contract:
//
//   - decode gives what encoding/json gives for every document, or the
//     same error; the fast path gives up rather than decode differently.
//   - AppendOp writes byte for byte what json.Marshal writes for the op.
//   - Raw sends the request consul/api sends for the same path and
//     options (URL, query, token, basic auth, Content-Type); a status
//     other than 200 is an api.StatusError with the answer as its body.
//
// Nothing here knows of ownership: the package moves bytes and types.
package wire
