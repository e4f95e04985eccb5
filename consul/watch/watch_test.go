package watch

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestNext(t *testing.T) {
	tests := []struct {
		name      string
		prev, got uint64
		next      uint64
		changed   bool
	}{
		{"first answer", 0, 10, 10, true},
		{"a return is not a change", 10, 10, 10, false},
		{"moved", 10, 12, 12, true},
		{"went back: re-read from 0", 12, 5, 0, true},
		{"zero: re-read, blocking", 12, 0, 1, true},
		{"zero on the first answer", 0, 0, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, changed := Next(tt.prev, tt.got)
			if next != tt.next || changed != tt.changed {
				t.Errorf("Next(%d, %d) = %d, %v; want %d, %v", tt.prev, tt.got, next, changed, tt.next, tt.changed)
			}
		})
	}
}

func TestAggregate(t *testing.T) {
	c := func(id, status string) *api.HealthCheck { return &api.HealthCheck{CheckID: id, Status: status} }
	tests := []struct {
		name   string
		checks api.HealthChecks
		want   string
	}{
		{"no checks", nil, StatusPassing},
		{"passing", api.HealthChecks{c("serfHealth", "passing"), c("a", "passing")}, StatusPassing},
		{"warning", api.HealthChecks{c("a", "passing"), c("b", "warning")}, StatusWarning},
		{"critical wins", api.HealthChecks{c("a", "critical"), c("b", "warning")}, StatusCritical},
		{"service maintenance", api.HealthChecks{c("a", "passing"), c("_service_maintenance:web-1", "critical")}, StatusMaintenance},
		{"node maintenance", api.HealthChecks{c("_node_maintenance", "critical")}, StatusMaintenance},
		{"nil check ignored", api.HealthChecks{nil, c("a", "warning")}, StatusWarning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Aggregate(tt.checks); got != tt.want {
				t.Errorf("Aggregate = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestLoop drives Loop with scripted answers: unchanged returns are not
// delivered, an index gone back is delivered and the next query asks from
// 0, errors back off on the clock, do not end the loop and make the next
// query ask from 0.
func TestLoop(t *testing.T) {
	type answer struct {
		index uint64
		err   error
	}
	script := []answer{{10, nil}, {10, nil}, {0, errors.New("down")}, {11, nil}, {4, nil}, {4, nil}}
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var asked []uint64
	var delivered []uint64
	n := 0
	fetch := func(_ context.Context, index uint64) (uint64, uint64, error) {
		asked = append(asked, index)
		if n == len(script) {
			cancel()
			return 0, 0, ctx.Err()
		}
		a := script[n]
		n++
		return a.index, a.index, a.err
	}
	done := make(chan struct{})
	var errs int
	go func() {
		defer close(done)
		Loop(ctx, fetch, func(v uint64) { delivered = append(delivered, v) }, LoopOptions{Clock: clk, OnError: func(error, int) { errs++ }})
	}()
	for !clk.HasWaiters() {
		select {
		case <-done:
			t.Fatal("loop ended before backing off")
		default:
			time.Sleep(time.Millisecond) // polling the fake clock for its waiter
		}
	}
	clk.Step(time.Minute)
	<-done
	wantAsked := []uint64{0, 10, 10, 0, 11, 0, 4}
	wantDelivered := []uint64{10, 11, 4, 4}
	if !slices.Equal(asked, wantAsked) || !slices.Equal(delivered, wantDelivered) || errs != 1 {
		t.Fatalf("asked %v (want %v), delivered %v (want %v), errors %d", asked, wantAsked, delivered, wantDelivered, errs)
	}
}
