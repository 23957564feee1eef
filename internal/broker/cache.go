package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/moby/moby/client"
)

// RemovePopulateContainers removes the containers this broker's name
// created to fill a cache volume. Each lives within one call of one
// process (created, used, removed); the daemon calls this at start, before
// it fills anything, so each one found was left by an earlier process
// killed mid-way. Left, it held its half-filled volume: the volume failed
// its content check and could not be removed to be filled again, and
// every job needing it ended error.
func (b *Broker) RemovePopulateContainers(ctx context.Context) (int, error) {
	f := make(client.Filters).Add("label", LabelBroker+"="+b.cfg.Name).Add("label", LabelRole+"="+rolePopulate)
	cs, err := b.eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("list populate containers: %w", err)
	}
	var errs []error
	n := 0
	for _, c := range cs.Items {
		if _, err := b.eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("remove populate container %s: %w", c.ID, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// RemoveCache removes the cache volumes (helper, read-only inputs) and any
// populate containers a broker named brokerName created. Volumes still in
// use by a container are not removed; that is reported as an error.
func RemoveCache(ctx context.Context, eng Engine, brokerName string) error {
	f := make(client.Filters).Add("label", LabelBroker+"="+brokerName)
	var errs []error
	cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f.Clone().Add("label", LabelRole+"="+rolePopulate)})
	if err != nil {
		return fmt.Errorf("list populate containers: %w", err)
	}
	for _, c := range cs.Items {
		if _, err := eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !isNotFound(err) {
			errs = append(errs, err)
		}
	}
	vs, err := eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vs.Items {
		if _, err := eng.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{}); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("remove volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}
