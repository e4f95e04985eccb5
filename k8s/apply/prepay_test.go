package apply

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// budgetWriter is a Writer whose budget refills one write per 1,000 s:
// within a test, a write that has to wait for the budget cannot get it
// and fails at once (rate.Limiter refuses a wait past ctx's deadline).
func budgetWriter(t *testing.T, burst int) (*Writer, context.Context) {
	t.Helper()
	w, err := New(fake.NewClientset(), labelOwner{}, Options{QPS: 0.001, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return w, ctx
}

// create creates slice i through w; an error means it had to wait.
func create(ctx context.Context, w *Writer, i int) error {
	_, err := w.CreateSlice(ctx, slice(fmt.Sprintf("s%d", i), "us"))
	return err
}

// TestPrepaidWritesDoNotWait: the writes of a ctx that prepaid n spend the
// tokens taken once; the n+1th waits for the budget like any write.
func TestPrepaidWritesDoNotWait(t *testing.T) {
	w, ctx := budgetWriter(t, 5)
	pctx, err := w.Prepay(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if tokens := w.limiter.Tokens(); tokens < 1.99 || tokens > 2.01 {
		t.Fatalf("%.2f tokens left of a burst of 5 after prepaying 3, want 2", tokens)
	}
	for i := range 3 {
		if err := create(pctx, w, i); err != nil {
			t.Fatalf("prepaid write %d: %v", i, err)
		}
	}
	// Two of the burst are left: two plain writes, then the budget is spent.
	for i := 3; i < 5; i++ {
		if err := create(ctx, w, i); err != nil {
			t.Fatalf("write %d within the burst: %v", i, err)
		}
	}
	if err := create(pctx, w, 5); !isBudget(err) {
		t.Fatalf("a 4th write of a ctx that prepaid 3: %v, want it to wait for the budget", err)
	}
}

// TestPrepayNeverExceedsTheBudget: a prepay of more than the burst takes
// the burst; tokens prepaid are gone from the budget for everyone else,
// spent or not, and serve only the Writer that took them.
func TestPrepayNeverExceedsTheBudget(t *testing.T) {
	w, ctx := budgetWriter(t, 4)
	pctx, err := w.Prepay(ctx, 10)
	if err != nil {
		t.Fatalf("prepay above the burst: %v", err)
	}
	if tokens := w.limiter.Tokens(); tokens > 0.01 {
		t.Fatalf("%.2f tokens left after prepaying the whole burst", tokens)
	}
	if err := create(ctx, w, 0); !isBudget(err) {
		t.Fatalf("a plain write with the burst prepaid elsewhere: %v, want a budget wait", err)
	}
	if _, err := w.Prepay(ctx, 1); !isBudget(err) {
		t.Fatalf("a second prepay on an empty budget: %v, want a budget wait", err)
	}
	other, _ := budgetWriter(t, 1)
	if err := create(pctx, other, 0); err != nil {
		t.Fatalf("other writer's own budget: %v", err)
	}
	if err := create(pctx, other, 1); !isBudget(err) {
		t.Fatalf("another Writer spent w's prepaid tokens: %v", err)
	}
	for i := range 4 {
		if err := create(pctx, w, i); err != nil {
			t.Fatalf("prepaid write %d: %v", i, err)
		}
	}
	if err := create(pctx, w, 4); !isBudget(err) {
		t.Fatalf("a 5th write on 4 prepaid: %v, want a budget wait", err)
	}
}

// TestPrepayUnlimited: without a budget Prepay is a no-op.
func TestPrepayUnlimited(t *testing.T) {
	w, err := New(fake.NewClientset(), labelOwner{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pctx, err := w.Prepay(ctx, 1000)
	if err != nil || pctx != ctx {
		t.Fatalf("Prepay unlimited: %v, ctx changed %v", err, pctx != ctx)
	}
}

// isBudget reports whether err is a write that had to wait for the budget.
func isBudget(err error) bool { return err != nil && strings.Contains(err.Error(), "write budget") }

// TestPrepayTopsUp: a Prepay on a ctx that carries w's prepaid writes adds
// to them (an adoption's second write in a flush that prepaid one).
func TestPrepayTopsUp(t *testing.T) {
	w, ctx := budgetWriter(t, 4)
	pctx, err := w.Prepay(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := create(pctx, w, 0); err != nil {
		t.Fatal(err)
	}
	more, err := w.Prepay(pctx, 1)
	if err != nil || more != pctx {
		t.Fatalf("top-up: %v, same ctx %v", err, more == pctx)
	}
	for i := 1; i < 3; i++ {
		if err := create(pctx, w, i); err != nil {
			t.Fatalf("prepaid write %d: %v", i, err)
		}
	}
	if err := create(ctx, w, 3); err != nil { // the burst's last token
		t.Fatal(err)
	}
	if err := create(pctx, w, 4); !isBudget(err) {
		t.Fatalf("a 4th write on 2+1 prepaid with the burst spent: %v, want a budget wait", err)
	}
}
