package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

const usage = `usage:
  image build [flags]             build the image (see -h)
  image push [-layout dir] IMAGE  push the layout's index to IMAGE (registry/name:tag)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the subcommand in args and returns the exit code: 0, 1 for a
// failed build or push, 2 for bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "build":
		var c Config
		fs := flag.NewFlagSet("image build", flag.ContinueOnError)
		fs.SetOutput(stderr)
		c.RegisterFlags(fs)
		if err := parse(fs, args[1:], 0); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		if err := c.Validate(); err != nil {
			fmt.Fprintf(stderr, "image build: %v\n", err)
			return 2
		}
		res, err := build(ctx, &c, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "image build: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s  index %s  (OCI layout %s)\n", c.Name, res.Index, res.Layout)
		for _, p := range res.Images {
			fmt.Fprintf(stdout, "  %-12s %s  %.1f MB compressed  %s\n", p.Platform.String(), p.Digest, float64(p.Size)/1e6, p.Tarball)
		}
		return 0
	case "push":
		fs := flag.NewFlagSet("image push", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dir := fs.String("layout", "out/image/oci", "the OCI layout `directory` of image build")
		if err := parse(fs, args[1:], 1); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		ref := fs.Arg(0)
		d, err := push(ctx, *dir, ref)
		if err != nil {
			fmt.Fprintf(stderr, "image push: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s@%s\n", ref, d)
		return 0
	default:
		fmt.Fprintf(stderr, "image: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

// parse parses args into fs and checks that nargs arguments follow the flags.
func parse(fs *flag.FlagSet, args []string, nargs int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errors.New(strings.TrimRight(usage, "\n"))
		}
		return err
	}
	if fs.NArg() != nargs {
		return fmt.Errorf("%s: want %d argument(s), got %q\n%s", fs.Name(), nargs, fs.Args(), usage)
	}
	return nil
}
