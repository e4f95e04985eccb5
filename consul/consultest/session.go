package consultest

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/hashicorp/consul/api"
)

// serveSession answers create, renew and destroy of a session, as far as a
// KV lock needs them (no checks, TTLs or lock delays).
func (s *Server) serveSession(w http.ResponseWriter, r *http.Request, verb, id string) {
	switch {
	case verb == "create" && id == "":
		var req struct{ Name, Behavior string } // the rest is not kept
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			http.Error(w, "Request decode failed: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.raft++ // a raft entry, as Consul's
		entry := &api.SessionEntry{ID: newUUID(), Name: req.Name, Behavior: req.Behavior, CreateIndex: s.raft}
		s.sessions[entry.ID] = entry
		writeJSON(w, 0, map[string]string{"ID": entry.ID})
	case verb == "renew" && id != "":
		entry := s.sessions[id]
		if entry == nil {
			http.Error(w, fmt.Sprintf("Session id '%s' not found", id), http.StatusNotFound)
			return
		}
		writeJSON(w, 0, []*api.SessionEntry{entry})
	case verb == "destroy" && id != "":
		if s.sessions[id] != nil {
			delete(s.sessions, id)
			s.raft++
			// Consul's release behaviour: the session's locks are let go.
			for k, p := range s.kv {
				if p.Session == id {
					c := *p
					c.Session, c.ModifyIndex = "", s.raft
					s.kv[k] = &c
					s.indexes["kvs"] = s.raft
				}
			}
		}
		writeJSON(w, 0, true)
	default:
		http.Error(w, "consultest: not served: "+r.Method+" "+r.URL.Path, http.StatusNotFound)
	}
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
