package shard

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestConfigFlagsAndValidate(t *testing.T) {
	parse := func(args ...string) (Config, error) {
		var c Config
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		c.RegisterFlags(fs)
		if err := fs.Parse(args); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	c, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Config{Shards: 1, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}); c != want {
		t.Errorf("defaults %+v, want %+v", c, want)
	}
	for _, tt := range []struct {
		args []string
		want string // "" valid
	}{
		{[]string{"--shards=8", "--lease-namespace=fs", "--replica-id=a"}, ""},
		{[]string{"--shards=0"}, "--shards=0: must be between 1 and 1024"},
		{[]string{"--shards=1025"}, "--shards=1025"},
		{[]string{"--shards=1", "--lease-renew-deadline=1h"}, ""}, // unsharded: timing unused
		{[]string{"--shards=2", "--lease-renew-deadline=13s"}, "--lease-duration (15s)"},
		{[]string{"--shards=2", "--lease-retry-period=0s"}, "--lease-retry-period (0s)"},
	} {
		_, err := parse(tt.args...)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%v: %v, want %q", tt.args, err, tt.want)
		}
	}
}
