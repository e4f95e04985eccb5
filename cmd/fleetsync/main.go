package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return runStatus(args[1:], stdout, stderr)
		case "purge":
			return runPurge(args[1:], stdout, stderr)
		case "preflight":
			return runPreflight(args[1:], stdout, stderr)
		case "acl-setup":
			return runACLSetup(args[1:], stdout, stderr)
		}
	}
	var cfg config
	fs := flag.NewFlagSet("fleetsync", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: fleetsync --cluster-id=ID [flags]\n"+
			"       fleetsync status|purge|acl-setup|preflight [flags]   (operator commands; --help for each)\n\n"+
			"Keeps the Consul catalog equal to the endpoints of annotated Kubernetes Services.\n"+
			"Every flag can also be set as FLEETSYNC_<FLAG_NAME> (e.g. FLEETSYNC_CLUSTER_ID).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg.registerFlags(fs)
	if err := cfg.parse(fs, args, os.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "fleetsync:", err)
		return 2
	}
	if cfg.Version {
		fmt.Fprintf(stdout, "fleetsync %s (commit %s, %s)\n", version, commit, runtime.Version())
		return 0
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stderr, "fleetsync:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon(ctx, cfg, stderr); err != nil {
		fmt.Fprintln(stderr, "fleetsync:", err)
		return 1
	}
	return 0
}
