package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/fleetsync/fleetsync/consul/conn"
)

// consul-k8s's connection variables, as its components read them
// (control-plane/subcommand/flags/consul.go) and the consul chart sets
// them (consul.consulK8sConsulServerEnvVars), so that a Deployment's
// environment written for consul-k8s's catalog sync works unchanged.
const (
	consulK8sAddressesEnv = "CONSUL_ADDRESSES"      // a host name or IP address of the servers
	consulK8sHTTPPortEnv  = "CONSUL_HTTP_PORT"      // their HTTP(S) port
	consulK8sUseTLSEnv    = "CONSUL_USE_TLS"        // a boolean: https
	consulK8sTokenEnv     = "CONSUL_ACL_TOKEN"      // wins over the token file, as in consul-k8s
	consulK8sTokenFileEnv = "CONSUL_ACL_TOKEN_FILE" //
	consulK8sCAFileEnv    = "CONSUL_CACERT_FILE"    // wins over the PEM, as in consul-k8s
	consulK8sCAPEMEnv     = "CONSUL_CACERT_PEM"     //
)

// connConfig is the connection of the flags, completed from consul-k8s's
// variables in the process's environment (see withConsulK8sEnv).
func connConfig(cfg config) (conn.Config, error) {
	return withConsulK8sEnv(consulConnConfig(cfg), os.Getenv)
}

// withConsulK8sEnv fills each connection setting that neither a flag (nor
// its FLEETSYNC_* variable) nor Consul's own variable set from
// consul-k8s's variable for it; cc holds the flags. For each setting the
// order is: the flag, then Consul's variable (CONSUL_HTTP_ADDR,
// CONSUL_HTTP_SSL, CONSUL_HTTP_TOKEN(_FILE), CONSUL_CACERT/CONSUL_CAPATH,
// CONSUL_TLS_SERVER_NAME), then consul-k8s's:
//
//   - address: $CONSUL_ADDRESSES:$CONSUL_HTTP_PORT (the port 8500, or 8501
//     with TLS, when the variable is unset); a host name that resolves to
//     every server is expanded as --consul-address's is. consul-k8s's
//     exec=<command> form is refused: fleetsync runs no commands.
//   - https: $CONSUL_USE_TLS.
//   - token: $CONSUL_ACL_TOKEN, else the file $CONSUL_ACL_TOKEN_FILE.
//   - CA: the file $CONSUL_CACERT_FILE, else the PEM $CONSUL_CACERT_PEM.
//   - TLS server name: with TLS and the address from $CONSUL_ADDRESSES,
//     that host name, as consul-k8s infers it.
//
// A value that cannot be used is an error naming the variable (consul-k8s
// ignores an unparsable port or boolean; a typo here would otherwise
// reach the wrong Consul, or the right one in clear text).
func withConsulK8sEnv(cc conn.Config, getenv func(string) string) (conn.Config, error) {
	if !cc.SSL && getenv("CONSUL_HTTP_SSL") == "" {
		if v := getenv(consulK8sUseTLSEnv); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cc, fmt.Errorf("environment variable %s=%q: want true or false", consulK8sUseTLSEnv, v)
			}
			cc.SSL = b
		}
	}
	host := strings.TrimSpace(getenv(consulK8sAddressesEnv))
	if len(cc.Addresses) == 0 && getenv("CONSUL_HTTP_ADDR") == "" && host != "" {
		addr, err := consulK8sAddress(host, getenv(consulK8sHTTPPortEnv), cc.SSL)
		if err != nil {
			return cc, err
		}
		cc.Addresses = []string{addr}
		if cc.SSL && cc.TLSServerName == "" && getenv("CONSUL_TLS_SERVER_NAME") == "" {
			cc.TLSServerName = host
		}
	}
	if cc.Token == "" && cc.TokenFile == "" && getenv("CONSUL_HTTP_TOKEN") == "" && getenv("CONSUL_HTTP_TOKEN_FILE") == "" {
		if cc.Token = getenv(consulK8sTokenEnv); cc.Token == "" {
			cc.TokenFile = getenv(consulK8sTokenFileEnv)
		}
	}
	if cc.CAFile == "" && len(cc.CAPem) == 0 && getenv("CONSUL_CACERT") == "" && getenv("CONSUL_CAPATH") == "" {
		if cc.CAFile = getenv(consulK8sCAFileEnv); cc.CAFile == "" {
			if pem := getenv(consulK8sCAPEMEnv); pem != "" {
				cc.CAPem = []byte(pem)
			}
		}
	}
	return cc, nil
}

// consulK8sAddress is host (from $CONSUL_ADDRESSES) with the HTTP port.
func consulK8sAddress(host, port string, tls bool) (string, error) {
	if strings.HasPrefix(host, "exec=") {
		return "", fmt.Errorf("environment variable %s=%q: fleetsync does not run a command to find Consul's servers; give --consul-address (a host name that resolves to every server is expanded)", consulK8sAddressesEnv, host)
	}
	if strings.ContainsAny(host, " \t,/") {
		return "", fmt.Errorf("environment variable %s=%q: want one host name or IP address (the port comes from %s)", consulK8sAddressesEnv, host, consulK8sHTTPPortEnv)
	}
	p := 8500
	if tls {
		p = 8501
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("environment variable %s=%q: want a port number (1-65535)", consulK8sHTTPPortEnv, port)
		}
		p = n
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(p)), nil
}
