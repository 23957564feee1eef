package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
)

// timingEngine records how long each engine call of the broker takes, to
// say where a job's time goes.
type timingEngine struct {
	broker.Engine
	mu    sync.Mutex
	calls map[string][]time.Duration
}

func newTimingEngine(e broker.Engine) *timingEngine {
	return &timingEngine{Engine: e, calls: map[string][]time.Duration{}}
}

func (t *timingEngine) record(name string, start time.Time) {
	d := time.Since(start)
	t.mu.Lock()
	t.calls[name] = append(t.calls[name], d)
	t.mu.Unlock()
}

func (t *timingEngine) reset() {
	t.mu.Lock()
	t.calls = map[string][]time.Duration{}
	t.mu.Unlock()
}

// medians returns each call's median in ms and how many times it ran.
func (t *timingEngine) medians() map[string][2]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string][2]float64{}
	for k, v := range t.calls {
		out[k] = [2]float64{float64(median(v)) / 1e6, float64(len(v))}
	}
	return out
}

// summary lists calls by median time, with calls per job.
func (t *timingEngine) summary(jobs int) string {
	m := t.medians()
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		if m[a][0] > m[b][0] {
			return -1
		}
		if m[a][0] < m[b][0] {
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.0f (x%.1f)", n, m[n][0], m[n][1]/float64(jobs)))
	}
	return strings.Join(parts, ", ")
}

func (t *timingEngine) ImageInspect(ctx context.Context, id string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	defer t.record("ImageInspect", time.Now())
	return t.Engine.ImageInspect(ctx, id, opts...)
}

func (t *timingEngine) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	defer t.record("ContainerCreate", time.Now())
	return t.Engine.ContainerCreate(ctx, o)
}

func (t *timingEngine) ContainerInspect(ctx context.Context, id string, o client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	defer t.record("ContainerInspect", time.Now())
	return t.Engine.ContainerInspect(ctx, id, o)
}

func (t *timingEngine) ContainerAttach(ctx context.Context, id string, o client.ContainerAttachOptions) (client.ContainerAttachResult, error) {
	defer t.record("ContainerAttach", time.Now())
	return t.Engine.ContainerAttach(ctx, id, o)
}

func (t *timingEngine) ContainerStart(ctx context.Context, id string, o client.ContainerStartOptions) (client.ContainerStartResult, error) {
	defer t.record("ContainerStart", time.Now())
	return t.Engine.ContainerStart(ctx, id, o)
}

// ContainerWait is timed from the call until the result arrives.
func (t *timingEngine) ContainerWait(ctx context.Context, id string, o client.ContainerWaitOptions) client.ContainerWaitResult {
	start := time.Now()
	w := t.Engine.ContainerWait(ctx, id, o)
	res := make(chan container.WaitResponse, 1)
	errc := make(chan error, 1)
	go func() {
		select {
		case r := <-w.Result:
			t.record("ContainerWait(from call)", start)
			res <- r
		case err := <-w.Error:
			errc <- err
		}
	}()
	return client.ContainerWaitResult{Result: res, Error: errc}
}

func (t *timingEngine) ContainerRemove(ctx context.Context, id string, o client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	defer t.record("ContainerRemove", time.Now())
	return t.Engine.ContainerRemove(ctx, id, o)
}

func (t *timingEngine) CopyToContainer(ctx context.Context, id string, o client.CopyToContainerOptions) (client.CopyToContainerResult, error) {
	defer t.record("CopyToContainer", time.Now())
	return t.Engine.CopyToContainer(ctx, id, o)
}

func (t *timingEngine) CopyFromContainer(ctx context.Context, id string, o client.CopyFromContainerOptions) (client.CopyFromContainerResult, error) {
	defer t.record("CopyFromContainer", time.Now())
	return t.Engine.CopyFromContainer(ctx, id, o)
}

func (t *timingEngine) ServerVersion(ctx context.Context, o client.ServerVersionOptions) (client.ServerVersionResult, error) {
	defer t.record("ServerVersion", time.Now())
	return t.Engine.ServerVersion(ctx, o)
}
