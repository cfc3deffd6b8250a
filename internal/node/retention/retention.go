// Package retention is the grid that says which of a volume's backups a
// backup target keeps as they age, in the form operators know from
// sanoid and zrepl: "1h:24,1d:14,1w:8,1m:12" keeps the first backup of
// each of the last 24 hours, of each of the last 14 days, of each of the
// last 8 weeks and of each of the last 12 months.
//
// Each span EVERY:COUNT cuts time into fixed blocks of EVERY counted from
// the Unix epoch (an hour on the hour, a day from midnight UTC) and keeps
// the first backup of each of its last COUNT blocks; a backup is kept if
// any span keeps it, and the newest is always kept (it is the base of the
// next incremental). Fixed blocks make a verdict final: a backup that is
// the first of its block stays the first, so it is kept until its block
// leaves every span's window, and a backup dropped is never wanted again.
// The windows are counted from the newest backup's blocks, not from the
// clock: a target whose backups stopped arriving keeps what it has. A
// late backup is a metric's business, never a reason to prune.
//
// The node checks a volume's grid at create, against its operator's
// bounds, and a backup target prunes by it.
package retention

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Span is Count consecutive intervals of Every each.
type Span struct {
	Every time.Duration
	Count int
}

// Grid is a retention grid: its spans from the finest to the coarsest,
// no two of the same interval.
type Grid []Span

// MaxIntervals bounds the sum of a grid's counts, and so the backups a
// target keeps of one volume: each is a snapshot the target lists and
// prunes.
const MaxIntervals = 1000

// MaxSpan bounds how far back one span reaches (its count times its
// interval): a hundred years, far beyond any backup's life, and within
// what a time.Duration holds (about 292 years).
const MaxSpan = 100 * 365 * 24 * time.Hour

// units are the interval units a grid is written in. A month is 30 days
// and a year 365, blocks of fixed length, not the calendar's. "m" is a
// month, as in sanoid's monthly; minutes are "min".
var units = []struct {
	name string
	d    time.Duration
}{
	{"min", time.Minute},
	{"h", time.Hour},
	{"d", 24 * time.Hour},
	{"w", 7 * 24 * time.Hour},
	{"m", 30 * 24 * time.Hour},
	{"y", 365 * 24 * time.Hour},
}

// Parse reads a grid written as comma-separated spans EVERY:COUNT, EVERY
// a whole number and a unit (min, h, d, w, m for 30 days, y for 365), in
// any order.
func Parse(s string) (Grid, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("retention grid is empty: want spans such as 1h:24,1d:14,1w:8,1m:12")
	}
	var g Grid
	total := 0
	for _, field := range strings.Split(s, ",") {
		span, err := parseSpan(strings.TrimSpace(field))
		if err != nil {
			return nil, fmt.Errorf("retention grid %q: %w", s, err)
		}
		if i := slices.IndexFunc(g, func(o Span) bool { return o.Every == span.Every }); i >= 0 {
			return nil, fmt.Errorf("retention grid %q: spans %s and %s have the same interval: write it once", s, g[i], span)
		}
		if total += span.Count; total > MaxIntervals {
			return nil, fmt.Errorf("retention grid %q: more than %d intervals in all: each keeps a backup on the target", s, MaxIntervals)
		}
		g = append(g, span)
	}
	slices.SortFunc(g, func(a, b Span) int { return cmp.Compare(a.Every, b.Every) })
	return g, nil
}

func parseSpan(field string) (Span, error) {
	every, count, ok := strings.Cut(field, ":")
	if !ok {
		return Span{}, fmt.Errorf("span %q: want EVERY:COUNT, such as 1d:14", field)
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return Span{}, fmt.Errorf("span %q: the count %q must be a whole number of intervals, at least 1", field, count)
	}
	d, err := parseEvery(every)
	if err != nil {
		return Span{}, fmt.Errorf("span %q: %w", field, err)
	}
	if d > MaxSpan/time.Duration(n) {
		return Span{}, fmt.Errorf("span %q reaches back more than 100 years", field)
	}
	return Span{Every: d, Count: n}, nil
}

func parseEvery(s string) (time.Duration, error) {
	digits := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if digits <= 0 {
		return 0, fmt.Errorf("the interval %q must be a whole number and a unit (min, h, d, w, m for 30 days, y for 365)", s)
	}
	n, err := strconv.Atoi(s[:digits])
	if err != nil || n < 1 || n > 1000 {
		return 0, fmt.Errorf("the interval %q must be 1 to 1000 of its unit", s)
	}
	for _, u := range units {
		if s[digits:] == u.name {
			if time.Duration(n) > MaxSpan/u.d { // before the product overflows
				return 0, fmt.Errorf("the interval %q is more than 100 years", s)
			}
			return time.Duration(n) * u.d, nil
		}
	}
	return 0, fmt.Errorf("the interval %q has no known unit: use min, h, d, w, m (30 days) or y (365 days)", s)
}

// String writes the grid as Parse reads it, each interval in the largest
// unit that divides it.
func (g Grid) String() string {
	spans := make([]string, len(g))
	for i, s := range g {
		spans[i] = s.String()
	}
	return strings.Join(spans, ",")
}

func (s Span) String() string {
	for i := len(units) - 1; i >= 0; i-- {
		if s.Every%units[i].d == 0 {
			return fmt.Sprintf("%d%s:%d", s.Every/units[i].d, units[i].name, s.Count)
		}
	}
	return fmt.Sprintf("%s:%d", s.Every, s.Count)
}

// Intervals is the sum of the grid's counts: the most backups it keeps
// but the newest.
func (g Grid) Intervals() int {
	n := 0
	for _, s := range g {
		n += s.Count
	}
	return n
}

// Horizon is how far back from the newest backup the grid keeps any.
func (g Grid) Horizon() time.Duration {
	var h time.Duration
	for _, s := range g {
		h = max(h, time.Duration(s.Count)*s.Every)
	}
	return h
}

// Keep says which of the backups taken at times the grid keeps: keep[i]
// for times[i]. times may be in any order; backups taken at the same
// instant are one backup to the grid, and every one of them has its
// verdict.
func (g Grid) Keep(times []time.Time) []bool {
	keep := make([]bool, len(times))
	if len(times) == 0 {
		return keep
	}
	newest := slices.MaxFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for _, s := range g {
		// The first backup of each block in the span's window.
		first := map[int64]time.Time{}
		last := s.block(newest)
		for _, t := range times {
			b := s.block(t)
			if b <= last-int64(s.Count) {
				continue
			}
			if f, seen := first[b]; !seen || t.Before(f) {
				first[b] = t
			}
		}
		for i, t := range times {
			if f, ok := first[s.block(t)]; ok && f.Equal(t) {
				keep[i] = true
			}
		}
	}
	for i, t := range times {
		keep[i] = keep[i] || t.Equal(newest)
	}
	return keep
}

// block is the index of the span's block that holds t, counted from the
// Unix epoch.
func (s Span) block(t time.Time) int64 {
	d := t.Sub(time.Unix(0, 0))
	b := int64(d / s.Every)
	if d < 0 && d%s.Every != 0 {
		b-- // floor, before the epoch
	}
	return b
}
