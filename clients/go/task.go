package dexworker

// One claimed task, from the poll to its report: the activity runs while a goroutine heartbeats
// (cancelling the activity's context when dex says the run is over or the lease is lost); then
// the result or the error goes to dex, called again after a failed call for as long as the
// lease would hold.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

type taskKey struct{}

// TaskOf is the task an activity's context runs (its run id, attempt, ...).
func TaskOf(ctx context.Context) (Task, bool) {
	task, ok := ctx.Value(taskKey{}).(Task)
	return task, ok
}

// lease is what the heartbeats learn of the task's lease; the activity's goroutine reads it.
type lease struct {
	mu      sync.Mutex
	renewed time.Time // when dex last confirmed the lease (the claim, then each heartbeat)
	ended   string    // "cancelled" or "lost" once dex said so; nothing is reported then
}

func (l *lease) end(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended == "" {
		l.ended = why
	}
}

func (l *lease) renew(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewed = at
}

func (l *lease) state() (time.Time, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed, l.ended
}

func (w *Worker) runTask(task *Task) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), taskKey{}, *task))
	defer cancel()
	held := &lease{renewed: time.Now()}
	stopBeating := make(chan struct{})
	beating := sync.WaitGroup{}
	beating.Add(1)
	go func() {
		defer beating.Done()
		w.heartbeats(task, held, cancel, stopBeating)
	}()
	outcome := w.attempt(ctx, task, held)
	close(stopBeating)
	beating.Wait()
	w.log.Printf("dexworker: task %d %s attempt %d: %s", task.TaskID, task.Name, task.Attempt, outcome)
}

// attempt runs the activity and reports; it returns what became of the task.
func (w *Worker) attempt(ctx context.Context, task *Task, held *lease) string {
	activity := w.activity(task.Name)
	if activity == nil { // dex hands out only the names polled for
		return w.fail(task, held, failure{
			Type: "NotRegistered", Message: "no activity " + task.Name + " in this worker", Terminal: true,
		})
	}
	result, err := call(ctx, activity, task.Args)
	if _, ended := held.state(); ended != "" {
		return ended // the run is over or the task is another's: nothing of ours is recorded
	}
	if err != nil {
		return w.fail(task, held, failureOf(err))
	}
	encoded, err := encode(result)
	if err != nil { // NaN, a channel, ...: the same next time, so final
		return w.fail(task, held, failure{Type: "ResultNotJSON", Message: text(err), Terminal: true})
	}
	body := completeRequest{LeaseVersion: task.LeaseVersion, WorkerID: w.options.WorkerID, Result: encoded}
	outcome, refused := w.report(task, held, "complete", body)
	if refused != nil { // too large, say: the same next time, so the attempt fails for good
		return w.fail(task, held, failure{Type: "ResultRefused", Message: refused.Message, Terminal: true})
	}
	return outcome
}

func (w *Worker) fail(task *Task, held *lease, described failure) string {
	body := failRequest{LeaseVersion: task.LeaseVersion, WorkerID: w.options.WorkerID, Error: described}
	outcome, refused := w.report(task, held, "fail", body)
	if refused != nil {
		w.log.Printf("dexworker: dex refused the failure of task %d: %v", task.TaskID, refused)
		return "refused"
	}
	return outcome
}

// report sends a complete or a fail, again after a call that failed on the way or in the
// server, for as long as the lease would still hold (later, dex gives the task to its next
// attempt anyway). It returns the outcome, or dex's refusal (a 4xx other than 409).
func (w *Worker) report(task *Task, held *lease, what string, body any) (string, *CallError) {
	timeout := time.Duration(task.HeartbeatTimeout * float64(time.Second))
	pause := newBackoff(w.options.MinBackoff/4, w.options.MaxBackoff)
	for {
		// a call that hangs is given up (and sent again, within the lease): it must not hold
		// the task, and a drain, for ever
		ctx, done := context.WithTimeout(context.Background(), 30*time.Second)
		err := w.api.post(ctx, taskPath(task, what), body, nil)
		done()
		var refused *CallError
		switch {
		case err == nil && what == "complete":
			return "completed", nil
		case err == nil:
			return "failed", nil
		case errors.As(err, &refused) && refused.Status == http.StatusConflict:
			// the lease is gone: it lapsed, the run ended, or (after a call cut off on the
			// way back) our first call went through
			return "lost", nil
		case refused != nil && !refused.transient():
			return "", refused
		}
		renewed, ended := held.state()
		if ended != "" {
			return ended, nil
		}
		wait := pause.next()
		if time.Since(renewed)+wait > timeout {
			w.log.Printf("dexworker: could not %s task %d before its lease lapsed (%v): dex retries it", what, task.TaskID, err)
			return "abandoned", nil
		}
		w.log.Printf("dexworker: %s of task %d failed (%v); again in %s", what, task.TaskID, err, wait.Round(time.Millisecond))
		time.Sleep(wait)
	}
}

// encode is the result's JSON; a MarshalJSON that panics is an error (encoding/json panics on).
func encode(result any) (encoded []byte, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			encoded, err = nil, fmt.Errorf("encoding the result panicked: %v", recovered)
		}
	}()
	return json.Marshal(result)
}

// call runs the activity; a panic is its error (the worker and its other tasks go on).
func call(ctx context.Context, activity ActivityFunc, args json.RawMessage) (result any, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			result, err = nil, &ActivityError{Type: "Panic", Message: fmt.Sprintf("%v", recovered)}
		}
	}()
	return activity(ctx, args)
}

func (w *Worker) heartbeats(task *Task, held *lease, cancel context.CancelFunc, stop <-chan struct{}) {
	timeout := time.Duration(task.HeartbeatTimeout * float64(time.Second))
	every := timeout / 3
	if every > w.options.MaxHeartbeatInterval {
		every = w.options.MaxHeartbeatInterval
	}
	if every < 50*time.Millisecond {
		every = 50 * time.Millisecond
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		// a heartbeat that hangs must not outlast the lease it is meant to keep
		ctx, done := context.WithTimeout(context.Background(), every*2)
		var answer heartbeatAnswer
		sent := time.Now()
		err := w.api.post(ctx, taskPath(task, "heartbeat"),
			leaseRequest{LeaseVersion: task.LeaseVersion, WorkerID: w.options.WorkerID}, &answer)
		done()
		var refused *CallError
		switch {
		case err == nil && answer.CancelRequested:
			held.end("cancelled")
			cancel()
			return
		case err == nil:
			held.renew(sent)
		case errors.As(err, &refused) && refused.Status == http.StatusConflict:
			held.end("lost")
			cancel()
			return
		default: // the server or the way there failed: the next beat tries again, within the lease
			w.log.Printf("dexworker: heartbeat of task %d failed: %v", task.TaskID, err)
		}
	}
}
