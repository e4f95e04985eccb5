package conn

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/hashicorp/consul/api"
)

// insecureTLSWarnings returns one sentence per setting of c that leaves the
// connection to Consul open to whoever is on its path: certificate
// verification turned off (consul/api does that, silently, for
// CONSUL_HTTP_SSL_VERIFY=false), and an ACL token or basic-auth password
// sent over plain http to an address that is not this host's. It reads c
// only, before or after api.NewClient (which moves an https:// or
// unix:// prefix of the address into the scheme and the transport).
func insecureTLSWarnings(c *api.Config) []string {
	scheme, host, local := consulEndpoint(c)
	var out []string
	if c.TLSConfig.InsecureSkipVerify {
		out = append(out, fmt.Sprintf("Consul's TLS certificate is not verified (CONSUL_HTTP_SSL_VERIFY is false, or set to something that is not a boolean): "+
			"anyone on the path to %s can pose as Consul, read the ACL token and change the catalog; unset CONSUL_HTTP_SSL_VERIFY and give Consul's CA with --consul-ca-file", host))
	}
	if scheme == "https" || local {
		return out
	}
	if c.Token != "" || c.TokenFile != "" {
		out = append(out, fmt.Sprintf("The Consul ACL token is sent in clear text: Consul at %s is reached over plain http; "+
			"use https (--consul-ssl, CONSUL_HTTP_SSL=true, or an https:// --consul-address)", host))
	}
	if c.HttpAuth != nil && c.HttpAuth.Password != "" {
		out = append(out, fmt.Sprintf("The HTTP basic auth password (CONSUL_HTTP_AUTH) is sent in clear text: Consul at %s is reached over plain http; "+
			"use https (--consul-ssl, CONSUL_HTTP_SSL=true, or an https:// --consul-address)", host))
	}
	return out
}

// consulEndpoint returns the scheme the client uses for c, the address it
// dials (for messages), and whether that stays on this host (a unix socket
// or a loopback address), as api.NewClient reads c.
func consulEndpoint(c *api.Config) (scheme, addr string, local bool) {
	scheme, addr = c.Scheme, c.Address
	if scheme == "" {
		scheme = "http"
	}
	if addr == "" {
		addr = "localhost:8500" // consulapi's default
	}
	if prefix, rest, ok := strings.Cut(addr, "://"); ok {
		switch prefix {
		case "https":
			scheme = "https"
		case "unix":
			return scheme, addr, true
		} // "http://" never turns an https scheme back to http
		addr = rest
	}
	host := addr
	if i := strings.IndexByte(host, '/'); i >= 0 { // a reverse proxy's path prefix
		host = host[:i]
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	ip, err := netip.ParseAddr(host)
	local = strings.EqualFold(host, "localhost") || (err == nil && ip.IsLoopback())
	return scheme, addr, local
}
