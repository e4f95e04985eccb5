package conn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/hashicorp/consul/api"
)

// Permission is one ACL check: access ("read" or "write") to a resource
// ("node", "key", ...) named segment.
type Permission struct {
	Resource string `json:"Resource"`
	Segment  string `json:"Segment,omitempty"`
	Access   string `json:"Access"`
}

func (p Permission) String() string {
	return fmt.Sprintf("%s:%s on %q", p.Resource, p.Access, p.Segment)
}

// ErrNotPermitted is matched by the error of Permissions when the token lacks
// one of the permissions asked for.
var ErrNotPermitted = errors.New("consul: the ACL token lacks a permission fleetsync needs")

// Permissions asks Consul whether the token every request of hc carries has
// each of want (/v1/internal/acl/authorize, the endpoint Consul's UI uses;
// a read, no Raft apply) and returns an error matching ErrNotPermitted that
// lists those it lacks. A Consul without the endpoint, or with ACLs off
// (401 "ACL support disabled"), is no error. cfg gives the scheme, address
// and datacenter; partition the admin partition ("" or "default": none).
func Permissions(ctx context.Context, hc *http.Client, cfg *api.Config, partition string, want []Permission) error {
	if len(want) == 0 {
		return nil
	}
	body, _ := json.Marshal(want)
	u := url.URL{Scheme: cfg.Scheme, Host: cfg.Address, Path: "/v1/internal/acl/authorize"}
	q := url.Values{}
	if cfg.Datacenter != "" {
		q.Set("dc", cfg.Datacenter)
	}
	if partition != "" && partition != "default" {
		q.Set("partition", partition)
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("check the ACL token's permissions: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return nil // no such endpoint: the writes will tell
	case resp.StatusCode == http.StatusUnauthorized && strings.Contains(string(b), "ACL support disabled"):
		return nil // ACLs off: everything is allowed
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("check the ACL token's permissions: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var got []struct {
		Permission
		Allow bool `json:"Allow"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		return fmt.Errorf("check the ACL token's permissions: %w", err)
	}
	var lacks []string
	for _, g := range got {
		if !g.Allow {
			lacks = append(lacks, g.Permission.String())
		}
	}
	if len(lacks) > 0 {
		return fmt.Errorf("%w: it lacks %s", ErrNotPermitted, strings.Join(lacks, ", "))
	}
	return nil
}

// NeededPermissions are the checks Permissions makes at start for owner's
// nodes (node:write on each) and, when claimKey is set, the claim's key
// (key:write). Service names are not known up front: a write the policy
// refuses is reported per Service (ConsulSyncFailed).
func NeededPermissions(nodes []string, claimKey string) []Permission {
	var out []Permission
	for _, n := range nodes {
		out = append(out, Permission{Resource: "node", Segment: n, Access: "write"})
	}
	if claimKey != "" {
		out = append(out, Permission{Resource: "key", Segment: claimKey, Access: "write"})
	}
	return out
}
