package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/moby/moby/client"
)

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
