package wire

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/wire/wiretest"
)

// aRead is one read of API, with the path it asks and what it gave.
type aRead struct {
	name, path string
	read       func(a API, q *api.QueryOptions) (any, error)
}

// everyRead is every read API sends (the transaction too: its answer is
// read as the others are).
var everyRead = []aRead{
	{"nodes", "/v1/catalog/nodes", func(a API, q *api.QueryOptions) (any, error) { v, _, err := a.CatalogNodes(q); return v, err }},
	{"node", "/v1/catalog/node/n1", func(a API, q *api.QueryOptions) (any, error) { v, _, err := a.CatalogNode("n1", q); return v, err }},
	{"node-service-list", "/v1/catalog/node-services/n1", func(a API, q *api.QueryOptions) (any, error) {
		v, _, err := a.NodeServiceList("n1", q)
		return v, err
	}},
	{"node-services", "/v1/catalog/node-services/n1", func(a API, q *api.QueryOptions) (any, error) {
		v, _, err := a.NodeServices("n1", q)
		return v, err
	}},
	{"health-node", "/v1/health/node/n1", func(a API, q *api.QueryOptions) (any, error) { v, _, err := a.HealthNode("n1", q); return v, err }},
	{"node-checks", "/v1/health/node/n1", func(a API, q *api.QueryOptions) (any, error) { v, _, err := a.NodeChecks("n1", q); return v, err }},
	{"service-entries", "/v1/health/service/web", func(a API, q *api.QueryOptions) (any, error) {
		v, _, err := a.ServiceEntries("web", q)
		return v, err
	}},
	{"txn", "/v1/txn", func(a API, q *api.QueryOptions) (any, error) {
		_, v, err := a.CommitTxn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVGet, Key: "k"}}}, []byte(`[]`), q)
		return v, err
	}},
}

// serve answers every request with status 200, Content-Type ct and body.
func serve(t testing.TB, ct string, body []byte) (API, func()) {
	return serveFunc(t, func() []byte { return body }, ct)
}

// serveFunc is serve with the body body() gives at each request; the
// Content-Type is JSON's unless ct names another.
func serveFunc(t testing.TB, body func() []byte, ct ...string) (API, func()) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := body()
		switch ct := append(ct, "application/json")[0]; ct {
		case "cut off": // the connection closes before the body ends
			w.Header().Set("Content-Length", strconv.Itoa(len(b)+100))
		default:
			w.Header().Set("Content-Type", ct)
		}
		_, _ = w.Write(b)
	}))
	cfg := api.DefaultConfig()
	cfg.Address = strings.TrimPrefix(srv.URL, "http://")
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw := NewRaw(cfg)
	raw.MaxAnswer = 64 << 10
	return API{C: c, Raw: raw}, srv.Close
}

// TestHostileAnswersAreErrorsNamingThePath: an answer a reader cannot use
// (a null element, a missing object, a body over the cap, cut short or
// not JSON, with status 200) is an ErrBadAnswer naming the request's
// path, for every read, through Raw and through consul/api alike.
func TestHostileAnswersAreErrorsNamingThePath(t *testing.T) {
	node := `{"ID":"x","Node":"n1","Address":"127.0.0.1"}`
	svc := `{"ID":"s1","Service":"web","Port":80}`
	chk := `{"CheckID":"c1","ServiceID":"s1","Status":"passing"}`
	everyBody := map[string]string{
		"html":      "<html><body><h1>502 Bad Gateway</h1></body></html>",
		"truncated": `[{"ID":"x","Node":"n1","Addr`,
		"empty":     "",
		"text":      "upstream connect error or disconnect/reset before headers",
	}
	nulls := map[string][]string{ // per read: answers with a null element or a missing object
		"nodes":             {`[null]`, `[` + node + `,null]`},
		"node":              {`{"Node":null,"Services":{}}`, `{"Node":` + node + `,"Services":{"s1":null}}`},
		"node-service-list": {`{"Node":` + node + `,"Services":[null]}`},
		"node-services":     {`{"Node":` + node + `,"Services":[` + svc + `,null]}`},
		"health-node":       {`[null]`, `[` + chk + `,null]`},
		"node-checks":       {`[null]`, `[` + chk + `,null]`},
		"service-entries": {`[null]`, `[{"Node":` + node + `,"Service":null,"Checks":[]}]`, `[{"Service":` + svc + `,"Checks":[]}]`,
			`[{"Node":` + node + `,"Service":` + svc + `,"Checks":[null]}]`},
	}
	huge := append(bytes.Repeat([]byte(" "), 1<<20), "null"...) // what every read takes, but for its size
	for _, r := range everyRead {
		bodies := map[string][]byte{"over the cap": huge}
		for name, b := range everyBody {
			bodies[name] = []byte(b)
		}
		for i, b := range nulls[r.name] {
			bodies[fmt.Sprintf("null %d", i)] = []byte(b)
		}
		bodies["cut off"] = []byte(`null`) // with a Content-Length the body never reaches
		for name, body := range bodies {
			for _, via := range []string{"raw", "consul/api"} {
				if via == "consul/api" && (name == "over the cap" || r.name == "txn") {
					continue // only Raw bounds the size; the transaction always goes through Raw
				}
				t.Run(r.name+"/"+name+"/"+via, func(t *testing.T) {
					ct := "application/json"
					if name == "html" {
						ct = "text/html"
					}
					if name == "cut off" {
						ct = "cut off"
					}
					a, stop := serve(t, ct, body)
					defer stop()
					if via == "consul/api" {
						a.Raw = nil
					}
					got, err := r.read(a, (&api.QueryOptions{}).WithContext(t.Context()))
					if !errors.Is(err, ErrBadAnswer) || !strings.Contains(err.Error(), r.path) {
						t.Fatalf("got %#v, %v; want an ErrBadAnswer naming %s", got, err, r.path)
					}
				})
			}
		}
	}
}

// FuzzReads serves each fuzzed body with status 200 to every read: none
// panics, and each either gives what its reader can use (checkAnswer) or
// an ErrBadAnswer naming its path.
func FuzzReads(f *testing.F) {
	for _, name := range []string{wiretest.NodeServices, wiretest.NodeChecks, wiretest.TxnAnswer} {
		f.Add(wiretest.Read(f, name))
	}
	for _, b := range []string{`[null]`, `{"Services":[null]}`, `[{"Node":{"Node":"n"},"Service":null}]`, `[{"Checks":[null]}]`,
		`{"Node":null}`, `{"Node":{"Node":"n"},"Services":{"a":null}}`, `{"Results":[null],"Errors":[null]}`, "<html>", `[{"ID":"x"`, ""} {
		f.Add([]byte(b))
	}
	var body atomic.Pointer[[]byte]
	a, stop := serveFunc(f, func() []byte { return *body.Load() })
	defer stop()
	f.Fuzz(func(t *testing.T, b []byte) {
		body.Store(&b)
		for _, r := range everyRead {
			got, err := r.read(a, (&api.QueryOptions{}).WithContext(t.Context()))
			if err != nil {
				if !errors.Is(err, ErrBadAnswer) || !strings.Contains(err.Error(), r.path) {
					t.Fatalf("%s: %v; want an ErrBadAnswer naming %s", r.name, err, r.path)
				}
				continue
			}
			if where := checkAnswer(pointerTo(got)); where != "" {
				t.Fatalf("%s: no error for an answer with %s", r.name, where)
			}
		}
	})
}

// pointerTo returns a pointer to v's value, as checkAnswer takes it.
func pointerTo(v any) any {
	p := reflect.New(reflect.TypeOf(v))
	p.Elem().Set(reflect.ValueOf(v))
	return p.Interface()
}
