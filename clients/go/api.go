package dexworker

// The remote-worker API of dex (POST /v1/activity-tasks/...): one JSON call each, with the
// bearer token, and dex's refusals as *CallError values that carry the HTTP status.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Task is an activity task as the poll handed it out.
type Task struct {
	TaskID           int64           `json:"task_id"`
	RunID            string          `json:"run_id"`
	Name             string          `json:"name"`
	Attempt          int             `json:"attempt"`
	Args             json.RawMessage `json:"args"`
	LeaseVersion     int64           `json:"lease_version"`
	LeaseUntil       string          `json:"lease_until"`
	HeartbeatTimeout float64         `json:"heartbeat_timeout"`
}

// CallError is a call that did not get a 2xx answer: dex's {"error": {type, message}} with
// the status, or (Status 0) a call that got no answer at all (refused, cut off, timed out).
type CallError struct {
	Path       string
	Status     int
	Type       string
	Message    string
	RetryAfter time.Duration // from a 503's Retry-After header
}

func (e *CallError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s: no answer: %s", e.Path, e.Message)
	}
	return fmt.Sprintf("%s: %d %s: %s", e.Path, e.Status, e.Type, e.Message)
}

// transient says whether calling again may succeed: no answer, an answer that is not dex's
// (a proxy's page), a 5xx, or a 429.
func (e *CallError) transient() bool {
	return e.Status == 0 || e.Type == badAnswer || e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

const badAnswer = "BadAnswer"

// maxAnswer bounds what is read of an answer: a poll of 100 tasks with 2 MiB of arguments each
// is the largest dex sends.
const maxAnswer = 256 << 20

type api struct {
	base   string
	token  string
	client *http.Client
}

func (a *api) post(ctx context.Context, path string, body any, answer any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s: the request could not be encoded: %w", path, err)
	}
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+path, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	request.Header.Set("Content-Type", "application/json")
	if a.token != "" {
		request.Header.Set("Authorization", "Bearer "+a.token)
	}
	response, err := a.client.Do(request)
	if err != nil {
		return &CallError{Path: path, Message: err.Error()}
	}
	defer response.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(response.Body, maxAnswer))
	if err != nil {
		return &CallError{Path: path, Message: "the answer was cut off: " + err.Error()}
	}
	if response.StatusCode/100 != 2 {
		return refusal(path, response, raw)
	}
	if answer == nil {
		return nil
	}
	if err := json.Unmarshal(raw, answer); err != nil {
		// a proxy's page, or an answer cut short: a fault of the way there, worth another try
		return &CallError{Path: path, Status: response.StatusCode, Type: badAnswer, Message: err.Error()}
	}
	return nil
}

func refusal(path string, response *http.Response, raw []byte) *CallError {
	refused := &CallError{Path: path, Status: response.StatusCode, Type: http.StatusText(response.StatusCode)}
	var document struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &document) == nil && document.Error.Type != "" {
		refused.Type, refused.Message = document.Error.Type, document.Error.Message
	} else {
		refused.Message = strings.TrimSpace(string(raw[:min(len(raw), 200)]))
	}
	if seconds, err := strconv.Atoi(response.Header.Get("Retry-After")); err == nil && seconds > 0 {
		refused.RetryAfter = time.Duration(seconds) * time.Second
	}
	return refused
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

type pollRequest struct {
	WorkerID    string   `json:"worker_id"`
	Names       []string `json:"names"`
	Max         int      `json:"max"`
	WaitSeconds int      `json:"wait_seconds"`
}

type leaseRequest struct {
	LeaseVersion int64  `json:"lease_version"`
	WorkerID     string `json:"worker_id"`
}

type completeRequest struct {
	LeaseVersion int64           `json:"lease_version"`
	WorkerID     string          `json:"worker_id"`
	Result       json.RawMessage `json:"result"`
}

type failure struct {
	Type              string   `json:"type"`
	Message           string   `json:"message"`
	Terminal          bool     `json:"terminal"`
	RetryAfterSeconds *float64 `json:"retry_after_seconds"`
}

type failRequest struct {
	LeaseVersion int64   `json:"lease_version"`
	WorkerID     string  `json:"worker_id"`
	Error        failure `json:"error"`
}

type heartbeatAnswer struct {
	CancelRequested bool `json:"cancel_requested"`
}

func taskPath(task *Task, call string) string {
	return "/v1/activity-tasks/" + strconv.FormatInt(task.TaskID, 10) + "/" + call
}
