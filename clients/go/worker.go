// Package dexworker runs dex activities in Go: a worker that long-polls dex's remote-worker
// API (dex web's /v1/activity-tasks) for the activity names registered with it, runs each task
// within a concurrency limit while heartbeating, and reports the result or the error.
//
//	worker, err := dexworker.New(dexworker.Options{URL: "http://127.0.0.1:8765", Concurrency: 8})
//	worker.Register("resize-image", func(ctx context.Context, args json.RawMessage) (any, error) {
//		var image Image
//		if err := dexworker.DecodeArgs(args, &image); err != nil {
//			return nil, dexworker.Terminal("BadArguments", err.Error())
//		}
//		return resize(ctx, image)
//	})
//	err = worker.RunUntilSignal() // SIGTERM or SIGINT: stop polling, finish what runs, return
//
// Only the standard library is used.
package dexworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/rand"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// ActivityFunc runs one attempt of an activity. args is the JSON array of the workflow's
// arguments to ctx.activity; the result is encoded with encoding/json. ctx is cancelled when
// dex says the run was cancelled or ended, or the attempt's lease was lost: whatever the
// function returns then is not recorded.
type ActivityFunc func(ctx context.Context, args json.RawMessage) (any, error)

// Options configure a Worker. Only URL is required.
type Options struct {
	URL         string        // dex web's base URL, e.g. http://127.0.0.1:8765
	Token       string        // dex web's token, sent as "Authorization: Bearer"
	WorkerID    string        // default: go-HOSTNAME-PID
	Concurrency int           // tasks run at once; default 4
	PollWait    time.Duration // how long one long poll waits for work; default 20 s (at most 60 s)
	// MaxHeartbeatInterval bounds the time between heartbeats, which otherwise come three times
	// per lease (heartbeat_timeout / 3): how soon a cancellation reaches a task. Default 5 s.
	MaxHeartbeatInterval time.Duration
	MinBackoff           time.Duration // first pause after a failed call; default 1 s
	MaxBackoff           time.Duration // longest pause; default 30 s
	HTTPClient           *http.Client  // default: a client with no overall timeout (polls are long)
	Logger               *log.Logger   // default: log.Default()
}

// Worker polls for the activities registered with it and runs them. Build it with New.
type Worker struct {
	options    Options
	api        *api
	log        *log.Logger
	mu         sync.Mutex
	activities map[string]ActivityFunc
	running    bool
}

// New checks the options and returns a worker with no activities yet.
func New(options Options) (*Worker, error) {
	if options.URL == "" {
		return nil, errors.New("dexworker: Options.URL is required")
	}
	if options.WorkerID == "" {
		host, _ := os.Hostname()
		options.WorkerID = fmt.Sprintf("go-%s-%d", host, os.Getpid())
	}
	if err := checkText("worker id", options.WorkerID); err != nil {
		return nil, err
	}
	if options.Concurrency <= 0 {
		options.Concurrency = 4
	}
	if options.PollWait <= 0 {
		options.PollWait = 20 * time.Second
	}
	if options.PollWait > 60*time.Second {
		options.PollWait = 60 * time.Second
	}
	if options.MaxHeartbeatInterval <= 0 {
		options.MaxHeartbeatInterval = 5 * time.Second
	}
	if options.MinBackoff <= 0 {
		options.MinBackoff = time.Second
	}
	if options.MaxBackoff < options.MinBackoff {
		options.MaxBackoff = 30 * time.Second
		if options.MaxBackoff < options.MinBackoff {
			options.MaxBackoff = options.MinBackoff
		}
	}
	client := options.HTTPClient
	if client == nil {
		client = &http.Client{}
	}
	logger := options.Logger
	if logger == nil {
		logger = log.Default()
	}
	return &Worker{
		options:    options,
		api:        &api{base: strings.TrimRight(options.URL, "/"), token: options.Token, client: client},
		log:        logger,
		activities: map[string]ActivityFunc{},
	}, nil
}

// Register makes the worker run the activity called name (the name the workflow passes to
// ctx.activity). Register before Run.
func (w *Worker) Register(name string, activity ActivityFunc) error {
	if err := checkText("activity name", name); err != nil {
		return err
	}
	if activity == nil {
		return fmt.Errorf("dexworker: activity %q: the function is nil", name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return errors.New("dexworker: Register after Run")
	}
	if _, taken := w.activities[name]; taken {
		return fmt.Errorf("dexworker: activity %q is registered already", name)
	}
	w.activities[name] = activity
	return nil
}

// checkText refuses what dex would refuse (422) in a name: empty, not UTF-8, or holding NUL.
func checkText(what, value string) error {
	if value == "" || !utf8.ValidString(value) || strings.ContainsRune(value, 0) {
		return fmt.Errorf("dexworker: the %s %q must be non-empty UTF-8 without NUL", what, value)
	}
	return nil
}

// RunUntilSignal runs the worker until SIGTERM or SIGINT, then drains as Run does. A second
// signal ends the process at once.
func (w *Worker) RunUntilSignal() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ctx.Done()
		stop() // the next signal has its default effect again
	}()
	defer stop()
	return w.Run(ctx)
}

// Run polls and runs tasks until ctx is done, then stops polling, lets the tasks it runs finish
// and report, and returns nil. It returns an error, after the same drain, only when dex refuses
// the poll itself for good (a wrong token, a name dex refuses). Failed calls are retried with
// an exponential backoff, never at once.
func (w *Worker) Run(ctx context.Context) error {
	names, err := w.start()
	if err != nil {
		return err
	}
	slots := make(chan struct{}, w.options.Concurrency)
	var inFlight sync.WaitGroup
	defer inFlight.Wait()
	backoff := newBackoff(w.options.MinBackoff, w.options.MaxBackoff)
	w.log.Printf("dexworker %s polling %s for %s", w.options.WorkerID, w.api.base, strings.Join(names, ", "))
	for {
		free := reserve(ctx, slots)
		if free == 0 {
			return nil // ctx is done: the deferred Wait drains
		}
		tasks, err := w.poll(ctx, names, free)
		for i := len(tasks); i < free; i++ {
			<-slots // the places no task came for
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil // the open poll was abandoned for the drain
			}
			var refused *CallError
			if errors.As(err, &refused) && !refused.transient() {
				return fmt.Errorf("dexworker: dex refuses this worker's polls: %w", err)
			}
			pause := backoff.next()
			if refused != nil && refused.RetryAfter > pause {
				pause = refused.RetryAfter
			}
			w.log.Printf("dexworker: poll failed (%v); polling again in %s", err, pause.Round(time.Millisecond))
			if !sleep(ctx, pause) {
				return nil
			}
			continue
		}
		backoff.reset()
		for i := range tasks {
			inFlight.Add(1)
			go func(task *Task) {
				defer func() { <-slots; inFlight.Done() }()
				w.runTask(task)
			}(&tasks[i])
		}
	}
}

func (w *Worker) start() ([]string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return nil, errors.New("dexworker: the worker is running already")
	}
	if len(w.activities) == 0 {
		return nil, errors.New("dexworker: no activity is registered")
	}
	w.running = true
	names := make([]string, 0, len(w.activities))
	for name := range w.activities {
		names = append(names, name)
	}
	return names, nil
}

// reserve takes at least one free place (waiting for one) and as many more as are free at once
// (up to the 100 a poll may ask for); 0 when ctx ended first.
func reserve(ctx context.Context, slots chan struct{}) int {
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	if ctx.Err() != nil {
		<-slots
		return 0
	}
	taken := 1
	for taken < 100 {
		select {
		case slots <- struct{}{}:
			taken++
		default:
			return taken
		}
	}
	return taken
}

func (w *Worker) poll(ctx context.Context, names []string, max int) ([]Task, error) {
	wait := int(w.options.PollWait / time.Second)
	// the client gives the server the wait and then some before it calls the poll lost
	pollCtx, cancel := context.WithTimeout(ctx, w.options.PollWait+30*time.Second)
	defer cancel()
	var tasks []Task
	err := w.api.post(pollCtx, "/v1/activity-tasks/poll",
		pollRequest{WorkerID: w.options.WorkerID, Names: names, Max: max, WaitSeconds: wait}, &tasks)
	if len(tasks) > max {
		tasks = tasks[:max] // never more than the places reserved (dex never sends more)
	}
	return tasks, err
}

func (w *Worker) activity(name string) ActivityFunc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.activities[name]
}

// sleep waits d or until ctx is done; false when ctx ended it.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff doubles a pause from min to max, with jitter so that many workers do not call a
// recovering server in step.
type backoff struct {
	min, max, current time.Duration
}

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max} }

func (b *backoff) next() time.Duration {
	if b.current == 0 {
		b.current = b.min
	} else if b.current *= 2; b.current > b.max {
		b.current = b.max
	}
	// between 3/4 and all of the pause
	return b.current - time.Duration(rand.Int63n(int64(b.current)/4+1))
}

func (b *backoff) reset() { b.current = 0 }
