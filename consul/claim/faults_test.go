package claim

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestClaimRecoversFromConsulLosingItsData: Consul restarts empty (the
// claim key and its session are gone): the first re-check claims the id
// again with a new session, without a refused lock, and writing goes on.
func TestClaimRecoversFromConsulLosingItsData(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real Consul agent")
	}
	ctx := t.Context()
	own, err := stack.StartConsul(ctx, stack.ConsulOptions{ExtraArgs: []string{"-hcl=disable_coordinates = true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Stop()
	cl, err := ClusterID(ctx, own.Client, Options{ClusterID: "lossy", KubeUID: "uid-1", Holder: "pod-a", TTL: time.Minute, CheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Release()
	if err := own.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.Failed(ctx); err != nil {
		t.Fatalf("re-check after Consul lost its data: %v", err)
	}
	if ok, why := cl.Held(); !ok {
		t.Fatalf("claim not held after the re-check: %s", why)
	}
	if v, held, err := Read(ctx, own.Client, "", "lossy"); err != nil || !held || v.KubeUID != "uid-1" {
		t.Fatalf("claim in Consul: %+v held=%v %v", v, held, err)
	}
	owner, err := ownership.New("lossy")
	if err != nil {
		t.Fatal(err)
	}
	in := owner.Stamp(consul.Instance{ID: owner.InstanceID("ns", "web", "10.0.0.1", 80), Name: "web", Address: "10.0.0.1", Port: 80,
		Check: consul.Check{Status: consul.StatusPassing}})
	c := consul.NewClient(own.Client, owner, consul.Options{Guard: cl})
	if _, err := c.Apply(ctx, consul.Change{Register: []consul.Instance{in}}); err != nil {
		t.Fatalf("guarded write after the re-claim: %v", err)
	}
}

// TestClaimKeyThatIsNotAClaimStopsWrites: someone overwrites the claim key
// with something else: writing stops and says why, instead of every
// transaction failing its claim check while /readyz says ready.
func TestClaimKeyThatIsNotAClaimStopsWrites(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	cl, err := ClusterID(ctx, a.Client, Options{ClusterID: "garbled", KubeUID: "uid-1", Holder: "pod-a", TTL: time.Minute, CheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Release()
	if _, err := a.Client.KV().Put(&api.KVPair{Key: DefaultPrefix + "/garbled", Value: []byte("hello")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := cl.Failed(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("re-check of a garbled claim: %v, want ErrLost", err)
	}
	if ok, why := cl.Held(); ok || !strings.Contains(why, "not a fleetsync claim") {
		t.Fatalf("Held = %v, %q", ok, why)
	}
	if _, err := cl.Ops(); !errors.Is(err, ErrLost) {
		t.Fatalf("Ops after the claim was garbled: %v", err)
	}
}

// kvServer answers the session and KV requests a Claim makes with
// minimal results, and records each (method, path and query). Consul
// Enterprise cannot run here, so these shapes are what the namespace and
// partition support is tested on.
type kvServer struct {
	mu   sync.Mutex
	reqs []string
	kv   []byte // the claim key's value once acquired
}

// client starts the server and returns a client of it in datacenter dc.
func (s *kvServer) client(t *testing.T, dc string) *api.Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reqs = append(s.reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		w.Header().Set("X-Consul-Index", "7")
		switch {
		case r.URL.Path == "/v1/session/create":
			_, _ = io.WriteString(w, `{"ID":"sess-1"}`)
		case strings.HasPrefix(r.URL.Path, "/v1/session/"):
			_, _ = io.WriteString(w, `[{"ID":"sess-1"}]`)
		case strings.HasPrefix(r.URL.Path, "/v1/kv/") && r.Method == http.MethodPut:
			s.kv = b
			_, _ = io.WriteString(w, `true`)
		case strings.HasPrefix(r.URL.Path, "/v1/kv/"):
			if s.kv == nil {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			fmt.Fprintf(w, `[{"Key":%q,"Value":%q,"Session":"sess-1","ModifyIndex":9}]`, strings.TrimPrefix(r.URL.Path, "/v1/kv/"), base64.StdEncoding.EncodeToString(s.kv))
		default:
			http.Error(w, "unexpected "+r.URL.Path, http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = strings.TrimPrefix(srv.URL, "http://")
	cfg.Datacenter = dc
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestScopeClaimShapes: the claim's session, its key's reads and writes,
// and the guard op of every transaction name the namespace and partition.
func TestScopeClaimShapes(t *testing.T) {
	s := &kvServer{}
	cl, err := ClusterID(t.Context(), s.client(t, "dc2"), Options{ClusterID: "c1", KubeUID: "uid-1", Holder: "pod-0",
		Scope: consul.Scope{Namespace: "team-a", Partition: "part-1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Release()
	s.mu.Lock()
	got := s.reqs
	s.mu.Unlock()
	want := []string{
		"PUT /v1/session/create?dc=dc2&ns=team-a&partition=part-1",
		"GET /v1/kv/fleetsync/clusters/c1?consistent=&dc=dc2&ns=team-a&partition=part-1",
		"PUT /v1/kv/fleetsync/clusters/c1?acquire=sess-1&dc=dc2&ns=team-a&partition=part-1",
		"GET /v1/kv/fleetsync/clusters/c1?consistent=&dc=dc2&ns=team-a&partition=part-1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("claim requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	ops, err := cl.Ops()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ops)
	if want := `[{"KV":{"Verb":"check-index","Key":"fleetsync/clusters/c1","Value":null,"Flags":0,"Index":9,"Session":"","Namespace":"team-a","Partition":"part-1"},"Node":null,"Service":null,"Check":null},` +
		`{"KV":{"Verb":"check-session","Key":"fleetsync/clusters/c1","Value":null,"Flags":0,"Index":0,"Session":"sess-1","Namespace":"team-a","Partition":"part-1"},"Node":null,"Service":null,"Check":null}]`; string(b) != want {
		t.Errorf("guard ops %s\nwant %s", b, want)
	}
}
