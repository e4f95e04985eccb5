package conn

import (
	"context"
	"fmt"

	"github.com/hashicorp/consul/api"
)

// ForeignEntry is one service entry on a node, with its service-level checks:
// what another tool (consul-k8s's catalog sync) registered, read as it is.
type ForeignEntry struct {
	ID, Service, Address string
	Port                 int
	Tags                 []string
	Meta                 map[string]string
	Namespace            string
	Checks               []ForeignCheck
}

// ForeignCheck is a check of a ForeignEntry.
type ForeignCheck struct {
	CheckID, Name, Status, Output, Type string
}

// ForeignEntries reads every service entry on node and their checks (nil and
// no error when the node does not exist). Read-only; for `fleetsync
// preflight`, which compares consul-k8s's node with what fleetsync would
// register.
func (cn *Conn) ForeignEntries(ctx context.Context, node string) ([]ForeignEntry, error) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	list, _, err := cn.api.Catalog().NodeServiceList(node, q)
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", node, err)
	}
	if list == nil {
		return nil, nil
	}
	checks, _, err := cn.api.Health().Node(node, q)
	if err != nil {
		return nil, fmt.Errorf("read checks of node %s: %w", node, err)
	}
	byService := map[string][]ForeignCheck{}
	for _, c := range checks {
		if c.ServiceID != "" {
			byService[c.ServiceID] = append(byService[c.ServiceID], ForeignCheck{CheckID: c.CheckID, Name: c.Name, Status: c.Status, Output: c.Output, Type: c.Type})
		}
	}
	out := make([]ForeignEntry, 0, len(list.Services))
	for _, s := range list.Services {
		out = append(out, ForeignEntry{ID: s.ID, Service: s.Service, Address: s.Address, Port: s.Port, Tags: s.Tags, Meta: s.Meta,
			Namespace: s.Namespace, Checks: byService[s.ID]})
	}
	return out, nil
}
