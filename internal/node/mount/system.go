//go:build linux

package mount

import "path/filepath"

// System is the real mount table, for the CSI node service.
type System struct{}

func (System) Lookup(path string) (Entry, bool, error) { return Lookup(filepath.Clean(path)) }

func (System) MountZFS(dataset, target string, flags []string) error {
	f, err := Flags(flags)
	if err != nil {
		return err
	}
	return ZFS(dataset, filepath.Clean(target), f)
}

func (System) Bind(source, target string, flags []string) error {
	f, err := Flags(flags)
	if err != nil {
		return err
	}
	return Bind(filepath.Clean(source), filepath.Clean(target), f)
}

func (System) Unmount(target string) error { return Unmount(filepath.Clean(target)) }

func (System) Statfs(path string) (Stats, error) { return Statfs(path) }
