package containerdengine

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd"
	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ContainerUpdate changes a container's memory limits, in its spec (what
// inspect reports) and in its running task's cgroup. Nothing else can be
// updated.
func (e *Engine) ContainerUpdate(ctx context.Context, id string, opts client.ContainerUpdateOptions) (client.ContainerUpdateResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.ContainerUpdateResult{}, err
	}
	r := opts.Resources
	if r == nil || r.Memory <= 0 {
		return client.ContainerUpdateResult{}, fmt.Errorf("update %s: only Memory and MemorySwap can be updated: %w", id, errdefs.ErrNotImplemented)
	}
	info, err := infoOf(ctx, c)
	if err != nil {
		return client.ContainerUpdateResult{}, err
	}
	// containerd creates a task from the spec it stores, not from the
	// one this engine checked when it read the record: the spec it holds
	// must be this engine's, and the one written in its place is made,
	// as at create, from the kept create options with the new limits,
	// and passes the same rows.
	_, in, err := e.checkRecord(info)
	if err != nil {
		return client.ContainerUpdateResult{}, fmt.Errorf("update %s: %w", id, err)
	}
	next, spec, err := e.updated(in, info.ID, r)
	if err != nil {
		return client.ContainerUpdateResult{}, fmt.Errorf("update %s: %w", id, err)
	}
	err = c.Update(ctx, func(ctx context.Context, _ *containerd.Client, c *containers.Container) error {
		a, err := typeurl.MarshalAny(spec)
		if err != nil {
			return err
		}
		c.Spec = a
		return nil
	})
	if err != nil {
		return client.ContainerUpdateResult{}, err
	}
	// Should this fail, the record's spec is one the kept options do not
	// make: the container gets no new task, and no further update.
	if err := e.keepInputs(info.ID, next); err != nil {
		return client.ContainerUpdateResult{}, fmt.Errorf("update %s: %w", id, err)
	}
	if t, err := c.Task(ctx, nil); err == nil {
		if err := t.Update(ctx, containerd.WithResources(&specs.LinuxResources{Memory: spec.Linux.Resources.Memory})); err != nil {
			return client.ContainerUpdateResult{}, err
		}
	}
	return client.ContainerUpdateResult{}, nil
}

// Events follows the namespace's container events as Docker names them
// (create, start, die, rename), with the container's labels and name as
// attributes, matching the "event" and "label" filters, until ctx ends.
// containerd replays nothing: only events from now on are seen.
func (e *Engine) Events(ctx context.Context, opts client.EventsListOptions) client.EventsResult {
	ctx = e.ns(ctx)
	out, errc := make(chan events.Message, 256), make(chan error, 1)
	msgs, errs := e.c.Subscribe(ctx, `namespace=="`+e.cfg.Namespace+`"`)
	wantEvents := opts.Filters["event"]
	terms := labelTerms(opts.Filters)
	known := map[string]map[string]string{} // container → last attributes seen
	renamed := map[string]string{}          // container → the name its last rename event gave
	attrs := func(id string) map[string]string {
		if c, err := e.c.LoadContainer(ctx, id); err == nil {
			if l, err := c.Labels(ctx); err == nil {
				a := userLabels(l)
				a["name"] = l[labelName]
				return a
			}
		}
		return known[id] // already gone: what it had
	}
	go func() {
		for {
			select {
			case env := <-msgs:
				v, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				var id string
				var action events.Action
				var labels map[string]string // as the event has them
				switch ev := v.(type) {
				case *eventstypes.ContainerCreate:
					id, action = ev.ID, events.ActionCreate
				case *eventstypes.TaskStart:
					id, action = ev.ContainerID, events.ActionStart
				case *eventstypes.TaskExit:
					if ev.ID != ev.ContainerID {
						continue // an exec'd process, not the container
					}
					id, action = ev.ContainerID, events.ActionDie
				case *eventstypes.ContainerUpdate:
					id, action, labels = ev.ID, events.ActionRename, ev.Labels
				default:
					continue
				}
				a := attrs(id)
				if labels != nil {
					a = userLabels(labels)
					a["name"] = labels[labelName]
				}
				if a == nil {
					continue
				}
				known[id] = a
				// containerd keeps the id a container was made with; a
				// rename changes its name label. An update's event carries
				// its labels; other events' are read when handled, not as
				// they were then: a subscriber behind the engine saw the
				// new name already on the create and the start, and took
				// the rename for another update (a soak under load lost a
				// pooled sandbox's take). So a rename is an update whose
				// name is not the id and not reported for it yet.
				if action == events.ActionRename {
					if a["name"] == "" || a["name"] == id || renamed[id] == a["name"] {
						continue // an update that did not rename it
					}
					renamed[id] = a["name"]
				}
				if (len(wantEvents) > 0 && !wantEvents[string(action)]) || !matchLabels(a, terms) {
					continue
				}
				m := events.Message{Type: events.ContainerEventType, Action: action, Actor: events.Actor{ID: id, Attributes: a},
					Time: env.Timestamp.Unix(), TimeNano: env.Timestamp.UnixNano()}
				select {
				case out <- m:
				case <-ctx.Done():
					errc <- ctx.Err()
					return
				}
			case err := <-errs:
				if ctx.Err() == nil {
					errc <- err
				} else {
					errc <- ctx.Err()
				}
				return
			case <-ctx.Done():
				// containerd's client ends its subscription without a word
				// when it is cancelled while handing over an event: the
				// stream's end is told here, once, whatever it was doing.
				errc <- ctx.Err()
				return
			}
		}
	}()
	return client.EventsResult{Messages: out, Err: errc}
}
