package dexworker_test

// What the tests share: the dex web they run against (DEX_URL, DEX_TOKEN: the pytest module
// tests/remote/test_sdk_go.py serves one and runs `go test` with them), runs started and read
// back over its JSON API, and a worker run in the background.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"dexworker"
)

func dexURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv("DEX_URL")
	if url == "" {
		t.Skip("DEX_URL is not set: these tests need a real dex web (tests/remote/test_sdk_go.py serves one)")
	}
	return strings.TrimRight(url, "/")
}

// call sends a JSON request to dex web with the token; the status and the answer's bytes.
func call(t *testing.T, method, path string, body string) (int, []byte) {
	t.Helper()
	request, err := http.NewRequest(method, dexURL(t)+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	request.Header.Set("Content-Type", "application/json")
	request.Header.Set("Authorization", "Bearer "+os.Getenv("DEX_TOKEN"))
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(response.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response.StatusCode, answer
}

// start starts the workflow sdk-call(name, args, maxAttempts); args is raw JSON (an array).
func start(t *testing.T, name string, args string, maxAttempts int) string {
	t.Helper()
	body := fmt.Sprintf(`{"workflow": "sdk-call", "args": [%q, %s, %d]}`, name, args, maxAttempts)
	return startRaw(t, body)
}

func startRaw(t *testing.T, body string) string {
	t.Helper()
	status, answer := call(t, http.MethodPost, "/v1/runs", body)
	if status != http.StatusCreated {
		t.Fatalf("starting %s: %d %s", body, status, answer)
	}
	var started struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(answer, &started); err != nil {
		t.Fatal(err)
	}
	return started.RunID
}

type failureDoc struct {
	Type    string      `json:"type"`
	Message string      `json:"message"`
	Cause   *failureDoc `json:"cause"`
}

type run struct {
	Status  string          `json:"status"`
	Result  json.RawMessage `json:"result"`
	Failure *failureDoc     `json:"failure"`
}

// wait reads the run until it ended (or fails the test after timeout), and reports it on a
// line `dex-run RUN_ID STATUS` that the pytest module checks against the engine.
func wait(t *testing.T, runID string, timeout time.Duration) run {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		status, answer := call(t, http.MethodGet, "/v1/runs/"+runID, "")
		if status != http.StatusOK {
			t.Fatalf("reading run %s: %d %s", runID, status, answer)
		}
		var found run
		if err := json.Unmarshal(answer, &found); err != nil {
			t.Fatal(err)
		}
		switch found.Status {
		case "COMPLETED", "FAILED", "CANCELLED":
			fmt.Printf("dex-run %s %s\n", runID, found.Status)
			return found
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is still %s after %s", runID, found.Status, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func expectResult(t *testing.T, got run, want any) {
	t.Helper()
	if got.Status != "COMPLETED" {
		t.Fatalf("the run is %s (%+v), not completed", got.Status, got.Failure)
	}
	encoded, _ := json.Marshal(want)
	var a, b any
	_ = json.Unmarshal(got.Result, &a)
	_ = json.Unmarshal(encoded, &b)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("result %s, want %s", got.Result, encoded)
	}
}

// cause is the activity's failure under the workflow's ActivityFailedError.
func cause(t *testing.T, got run) failureDoc {
	t.Helper()
	if got.Status != "FAILED" || got.Failure == nil || got.Failure.Cause == nil {
		t.Fatalf("the run is %s with failure %+v: not an activity's failure", got.Status, got.Failure)
	}
	return *got.Failure.Cause
}

// options are a worker's options for the tests: dex web, its token, quick backoffs.
func options(t *testing.T, id string) dexworker.Options {
	return dexworker.Options{
		URL: dexURL(t), Token: os.Getenv("DEX_TOKEN"), WorkerID: "go-test-" + id,
		PollWait: 2 * time.Second, MinBackoff: 200 * time.Millisecond, MaxBackoff: time.Second,
		Logger: log.New(os.Stdout, id+" ", log.Lmicroseconds),
	}
}

// background runs the worker until the returned stop is called; stop returns Run's error.
func background(t *testing.T, worker *dexworker.Worker) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Error("the worker did not stop within 30 s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func worker(t *testing.T, o dexworker.Options, activities map[string]dexworker.ActivityFunc) *dexworker.Worker {
	t.Helper()
	w, err := dexworker.New(o)
	if err != nil {
		t.Fatal(err)
	}
	for name, activity := range activities {
		if err := w.Register(name, activity); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func echo(_ context.Context, args json.RawMessage) (any, error) {
	var value any
	err := dexworker.DecodeArgs(args, &value)
	return value, err
}

func jsonString(s string) string {
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	encoder.SetEscapeHTML(false)
	_ = encoder.Encode(s)
	return strings.TrimSpace(buffer.String())
}
