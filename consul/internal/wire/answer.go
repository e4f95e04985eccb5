package wire

import (
	"errors"
	"fmt"
	"mime"
	"net/http"

	"github.com/hashicorp/consul/api"
)

// DefaultMaxAnswer bounds the body of one answer from Consul (Raw.MaxAnswer).
// Consul 1.14 writes 0.45 KB per instance in /v1/catalog/node-services and
// 0.38 KB per check in /v1/health/node (testdata: a node of 1,000
// instances), about 1.2 KB per instance in /v1/health/service (node,
// service and checks); every node of the 100,000-instance target read
// at a restart is 82 MiB in all. 64 MiB is one answer of ~140,000
// instances of a node, or ~50,000 of one service: far above any node
// fleetsync fills, while a hostile answer costs at most that much memory.
const DefaultMaxAnswer = 64 << 20

// ErrBadAnswer is wrapped by every error about what an answer holds: a
// body over the cap, cut short or not JSON, a null element of a list, or
// an object a reader needs missing. Each names the request's path.
var ErrBadAnswer = errors.New("bad answer from Consul")

// answerError names the request an answer came from and what is wrong
// with it; err (may be nil) is wrapped too.
func answerError(method, path, what string, err error) error {
	if err == nil {
		return fmt.Errorf("%w: %s %s: %s", ErrBadAnswer, method, path, what)
	}
	return fmt.Errorf("%w: %s %s: %s: %w", ErrBadAnswer, method, path, what, err)
}

// notJSON describes an answer that did not decode: by its Content-Type
// when that is not JSON (an HTML error page of a proxy, say).
func notJSON(h http.Header) string {
	ct := h.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); ct != "" && (err != nil || mt != "application/json") {
		return fmt.Sprintf("not JSON (Content-Type %q)", ct)
	}
	return "not the JSON expected"
}

// checkAnswer names the first place in a decoded answer that a reader
// could not use: a null element of a list (decoded as a nil pointer), or an object the reader needs missing (a
// health entry's Node or Service, a catalog node's Node). "" when there
// is none.
func checkAnswer(out any) string {
	switch o := out.(type) {
	case **NodeServices:
		if *o != nil {
			return nullIn("Services", (*o).Services)
		}
	case *NodeServices:
		return nullIn("Services", o.Services)
	case *[]*Check:
		return nullIn("", *o)
	case *[]*Entry:
		return checkEntries(*o)
	case *TxnResponse:
		return nullIn("Errors", o.Errors)
	case *[]*api.Node:
		return nullIn("", *o)
	case **api.CatalogNode:
		if n := *o; n != nil {
			if n.Node == nil {
				return "Node is missing"
			}
			for id, s := range n.Services {
				if s == nil {
					return fmt.Sprintf("Services[%q] is null", id)
				}
			}
		}
	case **api.CatalogNodeServiceList:
		if *o != nil { // Node is null for a node Consul does not know
			return nullIn("Services", (*o).Services)
		}
	case *api.HealthChecks:
		return nullIn("", *o)
	}
	return ""
}

func checkEntries(entries []*Entry) string {
	for i, e := range entries {
		switch {
		case e == nil:
			return fmt.Sprintf("[%d] is null", i)
		case e.Node == nil:
			return fmt.Sprintf("[%d].Node is missing", i)
		case e.Service == nil:
			return fmt.Sprintf("[%d].Service is missing", i)
		}
		if p := nullIn(fmt.Sprintf("[%d].Checks", i), e.Checks); p != "" {
			return p
		}
	}
	return ""
}

// nullIn names the first null element of list, under name.
func nullIn[T any](name string, list []*T) string {
	for i, v := range list {
		if v == nil {
			return fmt.Sprintf("%s[%d] is null", name, i)
		}
	}
	return ""
}
