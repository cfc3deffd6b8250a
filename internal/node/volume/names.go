package volume

import (
	"strings"
)

// datasetFor returns the dataset of volume id under root.
func datasetFor(root, id string) string { return root + "/" + id }

// shortName returns the part of a ZFS name after its last '/' or '@'.
func shortName(name string) string {
	if i := strings.LastIndexAny(name, "/@"); i >= 0 {
		return name[i+1:]
	}
	return name
}
