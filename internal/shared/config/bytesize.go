package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a size in bytes that reads "10G", "512M", "1T" or a plain
// number (binary units: K = 1024).
type ByteSize uint64

var units = []struct {
	suffix string
	shift  uint
}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}}

// ParseByteSize reads a size such as "10G" or "1073741824".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	for _, u := range units {
		if n, ok := strings.CutSuffix(t, u.suffix); ok {
			v, err := strconv.ParseUint(n, 10, 64)
			if err != nil || v > (1<<(64-u.shift))-1 {
				return 0, fmt.Errorf("size %q: want a whole number with an optional K, M, G or T suffix", s)
			}
			return ByteSize(v << u.shift), nil
		}
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a whole number with an optional K, M, G or T suffix", s)
	}
	return ByteSize(v), nil
}

func (b ByteSize) String() string {
	for _, u := range units {
		if b >= 1<<u.shift && uint64(b)%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", uint64(b)>>u.shift, u.suffix)
		}
	}
	return strconv.FormatUint(uint64(b), 10)
}

// UnmarshalJSON accepts a number or a string such as "10G".
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n uint64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size: want a number or a string such as \"10G\"")
	}
	v, err := ParseByteSize(s)
	*b = v
	return err
}

// Set and the String above make ByteSize a flag.Value.
func (b *ByteSize) Set(s string) error {
	v, err := ParseByteSize(s)
	*b = v
	return err
}
