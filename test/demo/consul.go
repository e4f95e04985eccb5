package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	consulapi "github.com/hashicorp/consul/api"
)

// instance is one catalog entry on fleetsync's node, with the status of
// its kubernetes-readiness check.
type instance struct {
	ID, Name, Address, Status string
	Port                      int
	Tags                      []string
	Meta                      map[string]string
}

func (i instance) addr() string { return net.JoinHostPort(i.Address, strconv.Itoa(i.Port)) }

func (i instance) row() string {
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", i.Name, node, i.addr(), i.Status, strings.Join(i.Tags, ","))
}

// watch is a Consul service and the instances it must have: keys
// ("addr:port=status,..." in address order), optionally followed by
// " tags=a,b" that every instance must carry in that order.
type watch struct{ service, want string }

// waitConsul waits for each watch in turn with Consul blocking queries on
// the service's health endpoint, whose index moves with every change to its
// instances and checks.
func (d *demo) waitConsul(watches ...watch) error {
	ctx, cancel := context.WithTimeout(d.ctx, waitLimit)
	defer cancel()
	for _, w := range watches {
		wantKeys, wantTags, _ := strings.Cut(w.want, " tags=")
		var index uint64
		for have := ""; ; {
			ins, last, err := d.query(ctx, w.service, index)
			if err != nil {
				if ctx.Err() != nil && d.ctx.Err() == nil {
					err = fmt.Errorf("consul service %s: want %q, have %q after %s", w.service, w.want, have, waitLimit)
				}
				return err
			}
			have = keys(ins)
			ok := have == wantKeys
			for _, in := range ins {
				if tags := strings.Join(in.Tags, ","); wantTags != "" && tags != wantTags {
					ok, have = false, have+" tags="+tags
					break
				}
			}
			if ok {
				break
			}
			// A return is not a change; an index that goes backwards restarts.
			if index = last; index < 1 {
				index = 1
			}
		}
	}
	return nil
}

// query reads service on our node; with index > 0 it blocks until the
// service's index passes index (or 5 s pass).
func (d *demo) query(ctx context.Context, service string, index uint64) ([]instance, uint64, error) {
	q := &consulapi.QueryOptions{Filter: fmt.Sprintf("Node.Node == %q", node), WaitIndex: index, WaitTime: 5e9}
	entries, meta, err := d.consul.Client.Health().Service(service, "", false, q.WithContext(ctx))
	if err != nil {
		return nil, 0, err
	}
	var out []instance
	for _, e := range entries {
		in := instance{ID: e.Service.ID, Name: e.Service.Service, Address: e.Service.Address, Port: e.Service.Port,
			Tags: e.Service.Tags, Meta: e.Service.Meta, Status: "(no check)"}
		for _, c := range e.Checks {
			if c.ServiceID == in.ID {
				in.Status = c.Status
			}
		}
		out = append(out, in)
	}
	// By name, then address: IPv4 sorts before "[IPv6]" (no more than 9 pods per service).
	slices.SortFunc(out, func(a, b instance) int { return strings.Compare(a.Name+" "+a.addr(), b.Name+" "+b.addr()) })
	return out, meta.LastIndex, nil
}

func (d *demo) instances(service string) ([]instance, error) {
	ins, _, err := d.query(d.ctx, service, 0)
	return ins, err
}

func keys(ins []instance) string {
	k := make([]string, len(ins))
	for i, in := range ins {
		k[i] = in.addr() + "=" + in.Status
	}
	return strings.Join(k, ",")
}

// printCatalog prints every service instance on fleetsync's node, marking
// the rows added (+) or changed (~) since the last print and listing the
// ones removed (-).
func (d *demo) printCatalog() error {
	q := &consulapi.QueryOptions{NodeMeta: map[string]string{"k8s-cluster": clusterID}}
	names, _, err := d.consul.Client.Catalog().Services(q.WithContext(d.ctx))
	if err != nil {
		return err
	}
	now := map[string]instance{}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "     SERVICE\tNODE\tADDRESS\tCHECK\tTAGS")
	for _, name := range slices.Sorted(maps.Keys(names)) {
		ins, err := d.instances(name)
		if err != nil {
			return err
		}
		for _, in := range ins {
			mark := " "
			if old, ok := d.catalog[in.ID]; !ok && d.catalog != nil {
				mark = "+"
			} else if ok && old.row() != in.row() {
				mark = "~"
			}
			fmt.Fprintf(tw, "   %s %s\n", mark, in.row())
			now[in.ID] = in
		}
	}
	for _, id := range slices.Sorted(maps.Keys(d.catalog)) {
		if _, ok := now[id]; !ok {
			fmt.Fprintf(tw, "   - %s\n", d.catalog[id].row())
		}
	}
	d.catalog = now
	return tw.Flush()
}

func formatMeta(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}
