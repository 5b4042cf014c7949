package dexworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"dexworker"
)

type image struct {
	Name  string `json:"name"`
	Width int    `json:"width"`
}

func TestCompletesActivitiesWithTheirArguments(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	w := worker(t, options(t, "args"), map[string]dexworker.ActivityFunc{
		"go-resize": func(ctx context.Context, args json.RawMessage) (any, error) {
			var picture image
			var factor int
			if err := dexworker.DecodeArgs(args, &picture, &factor); err != nil {
				return nil, dexworker.Terminal("BadArguments", err.Error())
			}
			task, _ := dexworker.TaskOf(ctx)
			return map[string]any{"name": picture.Name, "width": picture.Width / factor, "attempt": task.Attempt}, nil
		},
	})
	background(t, w)
	runs := []string{}
	for i := 1; i <= 3; i++ {
		runs = append(runs, start(t, "go-resize", `[{"name": "cat.png", "width": 640}, `+string(rune('0'+i))+`]`, 1))
	}
	for i, runID := range runs {
		expectResult(t, wait(t, runID, 20*time.Second), map[string]any{"name": "cat.png", "width": 640 / (i + 1), "attempt": 1})
	}
}

func TestAWrongTokenEndsRunWithAnError(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	o := options(t, "token")
	o.Token = "not-the-token"
	w := worker(t, o, map[string]dexworker.ActivityFunc{"go-token": echo})
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case err := <-done:
		var refused *dexworker.CallError
		if !errors.As(err, &refused) || refused.Status != http.StatusUnauthorized {
			t.Fatalf("Run returned %v, not the 401", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on polling with a token dex refuses")
	}
}

func TestNamesDexWouldRefuseAreRefusedAtRegister(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	w := worker(t, options(t, "names"), nil)
	for _, name := range []string{"", "a\x00b", "bad\xed\xa0\x80utf8"} {
		if err := w.Register(name, echo); err == nil {
			t.Errorf("Register(%q) was accepted", name)
		}
	}
	if _, err := dexworker.New(dexworker.Options{URL: dexURL(t), WorkerID: "nul\x00id"}); err == nil {
		t.Error("a worker id with NUL was accepted")
	}
	if err := w.Run(context.Background()); err == nil {
		t.Error("Run without activities did not refuse")
	}
}

func TestAtMostConcurrencyTasksRunAtOnce(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	var running, most int64
	o := options(t, "concurrency")
	o.Concurrency = 3
	w := worker(t, o, map[string]dexworker.ActivityFunc{
		"go-busy": func(ctx context.Context, args json.RawMessage) (any, error) {
			now := atomic.AddInt64(&running, 1)
			defer atomic.AddInt64(&running, -1)
			for {
				seen := atomic.LoadInt64(&most)
				if now <= seen || atomic.CompareAndSwapInt64(&most, seen, now) {
					break
				}
			}
			time.Sleep(300 * time.Millisecond)
			var index int
			return index, dexworker.DecodeArgs(args, &index)
		},
	})
	background(t, w)
	runID := startRaw(t, `{"workflow": "sdk-fan-out", "args": ["go-busy", 9]}`)
	expectResult(t, wait(t, runID, 30*time.Second), []int{0, 1, 2, 3, 4, 5, 6, 7, 8})
	if most != 3 {
		t.Fatalf("at most %d tasks ran at once, want 3 (the limit, reached)", most)
	}
}

func TestHeartbeatsKeepATaskLongerThanItsLease(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	w := worker(t, options(t, "heartbeat"), map[string]dexworker.ActivityFunc{
		"go-long": func(ctx context.Context, _ json.RawMessage) (any, error) {
			task, _ := dexworker.TaskOf(ctx)
			time.Sleep(time.Duration(task.HeartbeatTimeout*1.8) * time.Second) // the lease is 2 s
			return task.Attempt, nil
		},
	})
	background(t, w)
	expectResult(t, wait(t, start(t, "go-long", `[]`, 3), 30*time.Second), 1) // never claimed again
}

func TestCancellingTheRunCancelsTheActivitysContext(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	started, stopped := make(chan struct{}, 1), make(chan error, 1)
	w := worker(t, options(t, "cancel"), map[string]dexworker.ActivityFunc{
		"go-wait": func(ctx context.Context, _ json.RawMessage) (any, error) {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				stopped <- ctx.Err()
				return "stopped", nil // not recorded: the run is over
			case <-time.After(60 * time.Second):
				stopped <- nil
				return "never cancelled", nil
			}
		},
	})
	background(t, w)
	runID := start(t, "go-wait", `[]`, 1)
	<-started
	if status, answer := call(t, http.MethodPost, "/v1/runs/"+runID+"/cancel", `{}`); status != http.StatusAccepted {
		t.Fatalf("cancel: %d %s", status, answer)
	}
	select {
	case err := <-stopped:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the activity ended with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the activity's context was not cancelled")
	}
	if got := wait(t, runID, 10*time.Second); got.Status != "CANCELLED" {
		t.Fatalf("the run is %s", got.Status)
	}
}

func TestTerminalRetriedAndRetryAfterErrors(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	var mu sync.Mutex
	attempts := map[string][]time.Time{}
	note := func(ctx context.Context) int {
		task, _ := dexworker.TaskOf(ctx)
		mu.Lock()
		defer mu.Unlock()
		attempts[task.RunID] = append(attempts[task.RunID], time.Now())
		return task.Attempt
	}
	w := worker(t, options(t, "errors"), map[string]dexworker.ActivityFunc{
		"go-terminal": func(ctx context.Context, _ json.RawMessage) (any, error) {
			note(ctx)
			return nil, dexworker.Terminal("Refused", "no such image")
		},
		"go-flaky": func(ctx context.Context, _ json.RawMessage) (any, error) {
			if attempt := note(ctx); attempt < 3 {
				return nil, errors.New("upstream slow")
			}
			return "third time", nil
		},
		"go-later": func(ctx context.Context, _ json.RawMessage) (any, error) {
			if note(ctx) == 1 {
				return nil, dexworker.RetryAfter("RateLimited", "come back later", 1500*time.Millisecond)
			}
			return "later", nil
		},
	})
	background(t, w)
	terminal, flaky, later := start(t, "go-terminal", `[]`, 5), start(t, "go-flaky", `[]`, 3), start(t, "go-later", `[]`, 2)
	failed := cause(t, wait(t, terminal, 20*time.Second))
	if failed.Type != "Refused" || failed.Message != "no such image" {
		t.Fatalf("the failure is %+v", failed)
	}
	expectResult(t, wait(t, flaky, 20*time.Second), "third time")
	expectResult(t, wait(t, later, 20*time.Second), "later")
	mu.Lock()
	defer mu.Unlock()
	if len(attempts[terminal]) != 1 || len(attempts[flaky]) != 3 {
		t.Fatalf("attempts: terminal %d (want 1), flaky %d (want 3)", len(attempts[terminal]), len(attempts[flaky]))
	}
	if gap := attempts[later][1].Sub(attempts[later][0]); gap < 1200*time.Millisecond {
		t.Fatalf("the retry came %s after the failure, not after the 1.5 s asked for", gap)
	}
}

type unprintable struct{}

func (unprintable) Error() string { panic("an Error method that panics") }

type unwrapsBadly struct{}

func (unwrapsBadly) Error() string { return "fine so far" }
func (unwrapsBadly) Unwrap() error { panic("an Unwrap method that panics") }

type marshalsBadly struct{}

func (marshalsBadly) MarshalJSON() ([]byte, error) { panic("a MarshalJSON method that panics") }

func TestPoisonAffectsOnlyItsOwnRun(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	w := worker(t, options(t, "poison"), map[string]dexworker.ActivityFunc{
		"go-echo": echo,
		"go-panic": func(context.Context, json.RawMessage) (any, error) {
			panic("the activity panicked")
		},
		"go-unprintable": func(context.Context, json.RawMessage) (any, error) { return nil, unprintable{} },
		"go-unwraps":     func(context.Context, json.RawMessage) (any, error) { return nil, unwrapsBadly{} },
		"go-marshals":    func(context.Context, json.RawMessage) (any, error) { return marshalsBadly{}, nil },
		"go-nan":         func(context.Context, json.RawMessage) (any, error) { return math.NaN(), nil },
		"go-error-and-result": func(context.Context, json.RawMessage) (any, error) {
			return "a\x00b\xed\xa0\x80c", errors.New("not reached")
		},
		"go-nul-error": func(context.Context, json.RawMessage) (any, error) {
			return nil, dexworker.Terminal("Nul\x00Type", "a\x00b\xffc")
		},
	})
	background(t, w)

	// NUL in the arguments crosses both ways; a lone surrogate is refused at the start (dex
	// keeps only valid Unicode), which harms nothing
	expectResult(t, wait(t, start(t, "go-echo", `["a\u0000b\u00e9c"]`, 1), 20*time.Second), "a\x00béc")
	if status, answer := call(t, http.MethodPost, "/v1/runs",
		`{"workflow": "sdk-call", "args": ["go-echo", ["a\ud800b"], 1]}`); status != http.StatusUnprocessableEntity {
		t.Fatalf("a lone surrogate in the arguments: %d %s", status, answer)
	}

	panicked := cause(t, wait(t, start(t, "go-panic", `[]`, 1), 20*time.Second))
	if panicked.Type != "Panic" || panicked.Message != "the activity panicked" {
		t.Fatalf("the panic was recorded as %+v", panicked)
	}
	unprinted := cause(t, wait(t, start(t, "go-unprintable", `[]`, 1), 20*time.Second))
	if unprinted.Type != "unprintable" || !strings.Contains(unprinted.Message, "PANIC") {
		t.Fatalf("the unprintable error was recorded as %+v", unprinted)
	}
	unwrapped := cause(t, wait(t, start(t, "go-unwraps", `[]`, 1), 20*time.Second))
	if unwrapped.Type != "unwrapsBadly" || !strings.Contains(unwrapped.Message, "could not be read") {
		t.Fatalf("an error whose Unwrap panics was recorded as %+v", unwrapped)
	}
	marshalled := cause(t, wait(t, start(t, "go-marshals", `[]`, 3), 20*time.Second))
	if marshalled.Type != "ResultNotJSON" || !strings.Contains(marshalled.Message, "panicked") {
		t.Fatalf("a result whose MarshalJSON panics was recorded as %+v", marshalled)
	}
	notJSON := cause(t, wait(t, start(t, "go-nan", `[]`, 3), 20*time.Second))
	if notJSON.Type != "ResultNotJSON" {
		t.Fatalf("a NaN result was recorded as %+v", notJSON)
	}
	// an error with an invalid UTF-8 sequence: the error is what counts (the result is ignored)
	badUTF8 := cause(t, wait(t, start(t, "go-error-and-result", `[]`, 1), 20*time.Second))
	if badUTF8.Type != "Error" || badUTF8.Message != "not reached" {
		t.Fatalf("recorded as %+v", badUTF8)
	}
	nul := cause(t, wait(t, start(t, "go-nul-error", `[]`, 3), 20*time.Second))
	if nul.Type != "Nul\x00Type" || nul.Message != "a\x00b\ufffdc" {
		t.Fatalf("an error with NUL and a byte that is not UTF-8 was recorded as %q: %q", nul.Type, nul.Message)
	}

	// the worker goes on: a healthy task afterwards
	expectResult(t, wait(t, start(t, "go-echo", `[{"healthy": true}]`, 1), 20*time.Second), map[string]any{"healthy": true})
}

func TestAResultThatIsNotUTF8IsSentAsReplacementCharacters(t *testing.T) {
	w := worker(t, options(t, "utf8"), map[string]dexworker.ActivityFunc{
		"go-bytes": func(context.Context, json.RawMessage) (any, error) { return "a\x00b\xed\xa0\x80c", nil },
	})
	background(t, w)
	expectResult(t, wait(t, start(t, "go-bytes", `[]`, 1), 20*time.Second), "a\x00b\ufffd\ufffd\ufffdc")
}

func TestRunDrainsTheTasksItRunsBeforeReturning(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	started := make(chan struct{}, 1)
	var finished atomic.Value
	w := worker(t, options(t, "drain"), map[string]dexworker.ActivityFunc{
		"go-drain": func(context.Context, json.RawMessage) (any, error) {
			started <- struct{}{}
			time.Sleep(time.Second)
			finished.Store(time.Now())
			return "drained", nil
		},
	})
	stop := background(t, w)
	runID := start(t, "go-drain", `[]`, 1)
	<-started
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if finished.Load() == nil {
		t.Fatal("Run returned before its task finished")
	}
	expectResult(t, wait(t, runID, 10*time.Second), "drained") // reported before Run returned
}

func TestSIGTERMStopsPollingAndFinishesTheTaskInFlight(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	started := make(chan struct{}, 1)
	w := worker(t, options(t, "sigterm"), map[string]dexworker.ActivityFunc{
		"go-sigterm": func(context.Context, json.RawMessage) (any, error) {
			started <- struct{}{}
			time.Sleep(time.Second)
			return "finished", nil
		},
	})
	done := make(chan error, 1)
	go func() { done <- w.RunUntilSignal() }()
	runID := start(t, "go-sigterm", `[]`, 1)
	<-started
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunUntilSignal returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not stop after SIGTERM")
	}
	expectResult(t, wait(t, runID, 10*time.Second), "finished")
}
