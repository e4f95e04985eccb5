package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/worker"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

func newMux(sup *supervisor.Supervisor, toK8s *toK8sFleet, reg *prometheus.Registry, ready *readiness, cfg config) *http.ServeMux {
	mux := http.NewServeMux()
	if cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", redactedCmdline(os.Args))
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := ready.check(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /debug/workers", func(w http.ResponseWriter, r *http.Request) {
		ns, state := r.URL.Query().Get("namespace"), r.URL.Query().Get("state")
		var toK8sRows []wtok8s.Status
		for _, st := range toK8s.workers() {
			if ns == "" || st.Namespace == ns {
				toK8sRows = append(toK8sRows, st)
			}
		}
		if r.URL.Query().Get("direction") == "to-k8s" {
			if wantsText(r) {
				writeToK8sTable(w, toK8sRows)
				return
			}
			writeJSON(w, toK8sRows)
			return
		}
		checks := sup.ForeignChecks()
		var out []workerRow
		for _, st := range sup.Workers() {
			if (ns == "" || st.Namespace == ns) && (state == "" || string(st.State) == state) {
				out = append(out, workerRow{st, checks[k8s.Key{Namespace: st.Namespace, Name: st.Service}]})
			}
		}
		if wantsText(r) {
			writeTable(w, out)
			if len(toK8sRows) > 0 {
				fmt.Fprintln(w, "\nConsul -> Kubernetes (?direction=to-k8s):")
				writeToK8sTable(w, toK8sRows)
			}
			return
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /debug/shards", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"shards": cfg.Shard.Shards, "held": sup.HeldShards()})
	})
	mux.HandleFunc("GET /debug/workers/{namespace}/{service}", func(w http.ResponseWriter, r *http.Request) {
		key := k8s.Key{Namespace: r.PathValue("namespace"), Name: r.PathValue("service")}
		st, ok := sup.Worker(key)
		if !ok {
			http.Error(w, "no worker for this service", http.StatusNotFound)
			return
		}
		writeJSON(w, workerRow{st, sup.ForeignChecks()[key]})
	})
	return mux
}

func wantsText(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/plain")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// workerRow is one worker of /debug/workers: its status, and the checks
// someone else put on its node or instances (supervisor.ForeignChecks).
type workerRow struct {
	worker.Status
	ForeignChecks []string `json:"foreignChecks,omitempty"`
}

func writeTable(w http.ResponseWriter, rows []workerRow) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tSTATE\tWINDOW\tDESIRED\tREGISTERED\tPENDING\tLAST FLUSH\tFOREIGN CHECKS\tLAST ERROR")
	for _, s := range rows {
		last := "-"
		if !s.LastFlush.IsZero() {
			last = s.LastFlush.UTC().Format("15:04:05.000")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%t\t%s\t%d\t%s\n", s.Namespace, s.Service, s.State, s.Window,
			s.Desired, s.Registered, s.Pending, last, len(s.ForeignChecks), s.LastError)
	}
	_ = tw.Flush()
}

// writeToK8sTable writes the Consul -> Kubernetes workers' rows.
func writeToK8sTable(w http.ResponseWriter, sts []wtok8s.Status) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tCONSUL SERVICE\tMODE\tENDPOINTS\tWRITES\tFLUSHES\tERRORS\tLAST FLUSH\tTOOK\tHELD\tLAST ERROR")
	for _, s := range sts {
		mode, last, consul, held := "import", "-", s.ConsulService, s.Held
		if held == "" {
			held = "-"
		}
		if s.Mirror {
			mode = "mirror"
		}
		if consul == "" {
			consul = "- (deleting)"
		}
		if !s.LastFlush.IsZero() {
			last = s.LastFlush.UTC().Format("15:04:05.000")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", s.Namespace, s.Service, consul, mode,
			s.Endpoints, s.Writes, s.Flushes, s.Errors, last, s.LastFlushDuration.Round(time.Microsecond), held, s.LastError)
	}
	_ = tw.Flush()
}

// redacted replaces the value of a secret flag in what the HTTP listener
// shows.
const redacted = "<redacted>"

// redactedCmdline serves what pprof.Cmdline does (the command line,
// NUL-separated) with the value of every secret flag replaced: a
// --consul-token given as a flag must not be readable by whoever reaches
// /debug/pprof/.
func redactedCmdline(args []string) http.HandlerFunc {
	body := strings.Join(redactArgs(args), "\x00")
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprint(w, body)
	}
}

// redactArgs returns a copy of a command line (program first) with the
// value of every secret flag replaced by redacted, in the forms Go's flag
// package takes: -name=value, --name=value, and -name value, --name value
// (the next argument is the value).
func redactArgs(args []string) []string {
	out := slices.Clone(args)
	for i := 1; i < len(out); i++ {
		name, _, hasValue := strings.Cut(flagName(out[i]), "=")
		if name == "" || !secretFlag(name) {
			continue
		}
		if hasValue {
			out[i] = out[i][:strings.Index(out[i], "=")+1] + redacted
			continue
		}
		if i+1 < len(out) {
			i++
			out[i] = redacted
		}
	}
	return out
}

// flagName returns arg without its one or two leading dashes ("name" or
// "name=value"), or "" when arg is not a flag.
func flagName(arg string) string {
	if len(arg) < 2 || arg[0] != '-' || arg == "--" {
		return ""
	}
	arg = arg[1:]
	if arg[0] == '-' {
		arg = arg[1:]
	}
	return arg
}

// secretFlag reports whether the flag called name holds a secret: its name
// says token, password or secret, and it is not a *-file flag (those hold a
// path).
func secretFlag(name string) bool {
	name = strings.ToLower(name)
	if strings.HasSuffix(name, "-file") {
		return false
	}
	return strings.Contains(name, "token") || strings.Contains(name, "password") || strings.Contains(name, "secret")
}
