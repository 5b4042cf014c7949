package dexworker

import (
	"encoding/json"
	"fmt"
)

// DecodeArgs decodes the JSON array of a task's arguments into targets, one each, in order:
// DecodeArgs(args, &url, &width) for ctx.activity("resize", url, width). It is an error when
// the array has fewer elements than targets; more are ignored (a newer workflow may pass more).
func DecodeArgs(args json.RawMessage, targets ...any) error {
	var items []json.RawMessage
	if err := json.Unmarshal(args, &items); err != nil {
		return fmt.Errorf("the arguments are not a JSON array: %w", err)
	}
	if len(items) < len(targets) {
		return fmt.Errorf("%d arguments, %d wanted", len(items), len(targets))
	}
	for i, target := range targets {
		if err := json.Unmarshal(items[i], target); err != nil {
			return fmt.Errorf("argument %d: %w", i+1, err)
		}
	}
	return nil
}
