// Package tok8s runs the Consul -> Kubernetes fleet: it decides which units
// exist (a unit is one Kubernetes Service fed by one Consul service), starts
// one worker (package worker/tok8s) per unit, routes each change of a marked
// object to its unit's worker, and holds the fleet's bootstrap gate. It never
// writes to Kubernetes itself.
//
// Selection (Supervisor.units): in mirror mode every Consul service name
// that passes the name filters (allow and deny globs, deny wins; "consul"
// never) is the unit <namespace>/<prefix><name> (Name: a name that is not a
// valid Service name becomes a sanitised one with a hash). Import-mode
// units come from Options.Imports. Every Service or slice that carries the
// cluster's mark is a unit too, selected or not: a unit that is not
// selected has its objects deleted by its worker, which then ends.
//
// Lifecycle of Run: the marked-object informers start and sync and the
// first complete catalog answer arrives; only then does the gate open and
// may any worker write (each also waits for its own first health answer).
// On ctx done, Run stops every worker and returns once all have ended;
// nothing is deleted because of a stop.
package tok8s
