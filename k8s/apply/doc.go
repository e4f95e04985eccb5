// Package apply is the one place that writes the Kubernetes API for the
// Consul -> Kubernetes direction: EndpointSlices and mirror-mode Services.
//
// Contract:
//
//   - A Writer is built with an Owner (package ownership/k8smark). It sends
//     nothing for an object the owner does not accept: a create or an
//     update of an object without the mark, an update or a delete of an
//     object that was not read with the mark.
//   - Creates are plain creates: an object of the same name that exists is
//     never taken over (the caller gets an AlreadyExists error).
//   - Updates carry the resourceVersion read (an EndpointSlice update, a
//     Service's server-side apply under FieldManager); deletes carry UID and
//     resourceVersion preconditions. A conflict returns the API's error
//     (apierrors.IsConflict): the caller re-reads and diffs again. There is
//     no DeleteCollection and no write by label.
//   - Every request waits for the Writer's budget (QPS, Burst) first, or
//     spends a token its ctx prepaid (Prepay): a flush's writes go out back
//     to back; prepaid tokens left unspent are lost, never given back.
//
// The package imports nothing else of fleetsync's.
package apply
