// Package wire carries the catalog store's requests to Consul and its
// answers back: the lean types the reads of owned state and the
// transactions decode into, their JSON (decode for the answers, AppendOp
// for a transaction's ops, both github.com/goccy/go-json held to what
// encoding/json gives) and the raw HTTP that sends them as consul/api
// would and refuses answers a reader could not use (Raw, API).
//
// Contract:
//
//   - decode gives what encoding/json gives for every document, or an
//     error where it gives one.
//   - AppendOp writes byte for byte what json.Marshal writes for the op.
//   - Raw sends the request consul/api sends for the same path and
//     options (URL, query, token, basic auth, Content-Type); a status
//     other than 200 is an api.StatusError with the answer as its body.
//   - Every read's answer that is over Raw.MaxAnswer, cut short, not
//     JSON, or holds a null element or lacks an object its reader needs
//     is an ErrBadAnswer naming the request's path.
//
// Nothing here knows of ownership: the package moves bytes and types.
package wire
