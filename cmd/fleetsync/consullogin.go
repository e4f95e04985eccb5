package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/consul/conn"
)

// consul-k8s's login variables, as its components read them
// (control-plane/subcommand/flags/consul.go) and the consul chart sets
// them with manageSystemACLs: the defaults of the --consul-login-* flags.
const (
	loginAuthMethodEnv      = "CONSUL_LOGIN_AUTH_METHOD"
	loginBearerTokenFileEnv = "CONSUL_LOGIN_BEARER_TOKEN_FILE"
	loginDatacenterEnv      = "CONSUL_LOGIN_DATACENTER"
	loginMetaEnv            = "CONSUL_LOGIN_META"
	loginNamespaceEnv       = "CONSUL_LOGIN_NAMESPACE"
	loginPartitionEnv       = "CONSUL_LOGIN_PARTITION"
)

// consulLogin is how to log in to Consul (nil: with a token, not a login).
// Each --consul-login-* flag (or its FLEETSYNC_* variable) wins over
// consul-k8s's CONSUL_LOGIN_* variable for it. $CONSUL_LOGIN_AUTH_METHOD
// is not used when --consul-token or --consul-token-file is given (a flag
// wins over a variable); it wins over $CONSUL_HTTP_TOKEN and consul-k8s's
// $CONSUL_ACL_TOKEN, as consul-k8s's login wins over its token. The
// partition defaults to partition (the scope's). pod=<namespace>/<name>
// is added to the meta (withPodMeta).
func consulLogin(cfg config, partition string, getenv func(string) string) (*conn.LoginConfig, error) {
	method := cfg.LoginAuthMethod
	if method == "" && cfg.ConsulToken == "" && cfg.ConsulTokenFile == "" {
		method = strings.TrimSpace(getenv(loginAuthMethodEnv))
	}
	if method == "" {
		return nil, nil
	}
	meta, err := cfg.loginMeta()
	if err != nil {
		return nil, err
	}
	if len(cfg.LoginMeta.values) == 0 {
		if meta, err = parseLoginMetaEnv(getenv(loginMetaEnv)); err != nil {
			return nil, err
		}
	}
	first := func(flag, env, def string) string {
		if flag != "" {
			return flag
		}
		if v := strings.TrimSpace(getenv(env)); v != "" {
			return v
		}
		return def
	}
	return &conn.LoginConfig{
		AuthMethod:      method,
		BearerTokenFile: first(cfg.LoginBearerTokenFile, loginBearerTokenFileEnv, conn.DefaultBearerTokenFile),
		Meta:            withPodMeta(meta, getenv),
		Datacenter:      first(cfg.LoginDatacenter, loginDatacenterEnv, ""),
		Namespace:       first(cfg.LoginNamespace, loginNamespaceEnv, ""),
		Partition:       first(cfg.LoginPartition, loginPartitionEnv, partition),
	}, nil
}

// parseLoginMetaEnv parses $CONSUL_LOGIN_META: key=value pairs separated
// by commas, as the consul chart writes it
// ("component=sync-catalog,pod=$(NAMESPACE)/$(POD_NAME)"). consul-k8s
// skips a malformed pair; here it is an error naming the variable.
func parseLoginMetaEnv(v string) (map[string]string, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("environment variable %s=%q: want key=value pairs separated by commas (%q is not one)", loginMetaEnv, v, kv)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	return m, nil
}

// openConsul is the operator commands' connection (connConfig). With login
// (the command takes the --consul-login-* flags) and an auth method, it
// logs in as the daemon does (a refused login is an error naming the auth
// method); the returned func logs out (call it when done). Without, it is
// conn.Open's plain connection and the func does nothing.
func openConsul(ctx context.Context, cfg config, login bool) (*conn.Conn, func(), error) {
	cc, err := connConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	var lc *conn.LoginConfig
	if login {
		if lc, err = consulLogin(cfg, consulScope(cfg, os.Getenv).Partition, os.Getenv); err != nil {
			return nil, nil, err
		}
	}
	if lc == nil {
		cn, err := conn.Open(cc)
		return cn, func() {}, err
	}
	cn, err := conn.Dial(ctx, cc, conn.DialOptions{Login: lc})
	if err != nil {
		return nil, nil, err
	}
	if err := cn.Tokens().Login(ctx); err != nil {
		return nil, nil, err
	}
	logout := func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = cn.Tokens().Logout(lctx)
	}
	return cn, logout, nil
}
