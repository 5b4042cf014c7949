package dexworker

// What an activity's error tells dex: its type and message, whether it is final, and when to
// retry it.

import (
	"errors"
	"fmt"
	"reflect"
	"time"
)

// ActivityError is an activity's failure as dex records it. Return one (or wrap one) to choose
// the type dex shows, to fail for good (Terminal), or to retry after a delay of your choosing
// instead of the retry policy's (RetryAfter). Any other error is retried under the activity's
// retry policy, with its Go type's name as the type.
type ActivityError struct {
	Type       string
	Message    string
	Terminal   bool
	RetryAfter time.Duration // 0: the retry policy's delay
}

func (e *ActivityError) Error() string { return e.Type + ": " + e.Message }

// Terminal is a failure that is not retried: the workflow's ctx.activity raises at once.
func Terminal(kind, message string) error {
	return &ActivityError{Type: kind, Message: message, Terminal: true}
}

// RetryAfter is a failure retried after the given delay (if the retry policy has attempts left).
func RetryAfter(kind, message string, after time.Duration) error {
	return &ActivityError{Type: kind, Message: message, RetryAfter: after}
}

// failureOf is what dex is told of err. It never panics, even when err's Error, Unwrap or As
// method does.
func failureOf(err error) (described failure) {
	defer func() {
		if recovered := recover(); recovered != nil {
			described = failure{Type: typeName(err), Message: fmt.Sprintf("(the error could not be read: %v)", recovered)}
		}
	}()
	var chosen *ActivityError
	if errors.As(err, &chosen) && chosen != nil {
		kind := chosen.Type
		if kind == "" {
			kind = "Error" // dex refuses an empty type
		}
		described := failure{Type: kind, Message: chosen.Message, Terminal: chosen.Terminal}
		if chosen.RetryAfter > 0 {
			seconds := chosen.RetryAfter.Seconds()
			described.RetryAfterSeconds = &seconds
		}
		return described
	}
	return failure{Type: typeName(err), Message: text(err)}
}

// typeName is the name of err's type, or "Error" for the anonymous ones of errors.New and
// fmt.Errorf.
func typeName(err error) string {
	t := reflect.TypeOf(err)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Name() == "" || t.PkgPath() == "errors" || t.PkgPath() == "fmt" {
		return "Error"
	}
	return t.Name()
}

// text is err's message; fmt recovers from an Error method that panics and says so.
func text(err error) string {
	return fmt.Sprintf("%v", err)
}
