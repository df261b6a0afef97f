package ctxtime

import (
	"context"
	"testing"
	"time"
)

func TestSleepEndsWithTheDurationOrTheContext(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("a sleep that ran its course reported false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("a sleep under an ended context reported true")
	}
	if Sleep(ctx, 0) {
		t.Fatal("a zero sleep under an ended context reported true")
	}
	if !Sleep(context.Background(), -time.Second) {
		t.Fatal("a negative sleep reported false")
	}
}
