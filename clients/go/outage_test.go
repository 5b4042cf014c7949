package dexworker_test

// The server answering 500, or going away, between the worker and dex web: a proxy in front of
// it that can fail every call, hang up on every call, answer what is not dex's, or fail only the
// next complete.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"dexworker"
)

const (
	forward int32 = iota
	answer500
	hangUp
	notDex // a 200 with a page that is not dex's answer (a captive proxy)
)

type proxy struct {
	mode           int32 // forward, answer500, hangUp or notDex
	failCompletes  int32 // completes still to answer 500 while forwarding
	calls          int64 // calls while not forwarding
	failedComplete int64
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request, next http.Handler) {
	switch atomic.LoadInt32(&p.mode) {
	case answer500:
		atomic.AddInt64(&p.calls, 1)
		http.Error(w, "upstream exploded", http.StatusInternalServerError)
	case hangUp:
		atomic.AddInt64(&p.calls, 1)
		connection, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			connection.Close()
		}
	case notDex:
		atomic.AddInt64(&p.calls, 1)
		_, _ = w.Write([]byte("<html>please sign in</html>"))
	default:
		if strings.HasSuffix(r.URL.Path, "/complete") && atomic.AddInt32(&p.failCompletes, -1) >= 0 {
			atomic.AddInt64(&p.failedComplete, 1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error": {"type": "InternalError", "message": "the call failed inside dex"}}`))
			return
		}
		next.ServeHTTP(w, r)
	}
}

func TestFailedCallsAreRetriedWithBackoffAndTheWorkerRecovers(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	target, err := url.Parse(dexURL(t))
	if err != nil {
		t.Fatal(err)
	}
	upstream := httputil.NewSingleHostReverseProxy(target)
	faults := &proxy{}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		faults.ServeHTTP(w, r, upstream)
	}))
	defer server.Close()

	o := options(t, "outage")
	o.URL = server.URL // MinBackoff 200 ms, MaxBackoff 1 s
	w := worker(t, o, map[string]dexworker.ActivityFunc{"go-outage": echo})
	background(t, w)

	for _, mode := range []int32{answer500, hangUp, notDex} {
		atomic.StoreInt64(&faults.calls, 0)
		atomic.StoreInt32(&faults.mode, mode)
		time.Sleep(2 * time.Second)
		atomic.StoreInt32(&faults.mode, forward)
		// backing off 0.2, 0.4, 0.8, 1, 1 s: about five polls in 2 s; a hot loop makes thousands
		if calls := atomic.LoadInt64(&faults.calls); calls < 2 || calls > 8 {
			t.Fatalf("mode %d: %d polls in 2 s", mode, calls)
		}
	}

	// back to health, and the first complete answered 500: it is sent again and recorded once
	atomic.StoreInt32(&faults.failCompletes, 1)
	runID := start(t, "go-outage", `["after the outage"]`, 1)
	expectResult(t, wait(t, runID, 20*time.Second), "after the outage")
	if atomic.LoadInt64(&faults.failedComplete) != 1 {
		t.Fatalf("%d completes were failed by the proxy, want 1", faults.failedComplete)
	}
}

func TestAPollCutOffByTheDrainEndsRunAtOnce(t *testing.T) {
	t.Parallel() // each test has activity names of its own
	o := options(t, "idle")
	o.PollWait = 4 * time.Second // ends on the server while the other tests run (uvicorn waits for it)
	w := worker(t, o, map[string]dexworker.ActivityFunc{"go-idle": func(context.Context, json.RawMessage) (any, error) { return nil, nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	time.Sleep(500 * time.Millisecond) // the long poll is open
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run waited for its long poll to end")
	}
}
