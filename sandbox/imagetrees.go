package sandbox

import (
	"encoding/json"
	"fmt"
	"path"
)

// ImageTreesLabel is an image config label: the JSON list of directories
// of the image's single layer that a broker may serve from read-only
// volumes it fills from the image itself (see `sandboxd image build`'s
// "volume"). It changes where the files are read from, never what they
// are: a volume holds exactly the tree of the image's layer, checked file
// by file against it, and the image ID pins that layer.
const ImageTreesLabel = "org.sandboxd.image.volume-trees"

// ParseImageTrees reads the value of ImageTreesLabel: clean absolute
// directories, none "/", none within another, none at or within a mount
// point of a sandbox (its scratch space, inputs and helper).
func ParseImageTrees(label string) ([]string, error) {
	var trees []string
	if err := json.Unmarshal([]byte(label), &trees); err != nil {
		return nil, fmt.Errorf("label %s: not a JSON list of paths: %w", ImageTreesLabel, err)
	}
	for i, t := range trees {
		if !path.IsAbs(t) || path.Clean(t) != t || t == "/" {
			return nil, fmt.Errorf("label %s: %q is not a clean absolute directory other than /", ImageTreesLabel, t)
		}
		for _, r := range reservedPaths {
			if under(t, r) || under(r, t) {
				return nil, fmt.Errorf("label %s: %q overlaps %s, where every sandbox mounts its own", ImageTreesLabel, t, r)
			}
		}
		for _, o := range trees[:i] {
			if under(t, o) || under(o, t) {
				return nil, fmt.Errorf("label %s: %q and %q overlap", ImageTreesLabel, o, t)
			}
		}
	}
	return trees, nil
}

// HelperPath is where every sandbox mounts the broker's read-only helper
// volume.
const HelperPath = "/.sandboxd"

// reservedPaths are where a sandbox mounts its own: the scratch spaces
// (the code uid's too), the read-only inputs and the broker's helper.
var reservedPaths = []string{WorkPath, TmpPath, CodeTmpPath, BundlePath, InputsPath, HelperPath}
