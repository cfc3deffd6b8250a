package retention

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	hour = time.Hour
	day  = 24 * time.Hour
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Grid
		// canonical is String's output, when it differs from in.
		canonical string
	}{
		{in: "1h:24,1d:14,1w:8,1m:12", want: Grid{{hour, 24}, {day, 14}, {7 * day, 8}, {30 * day, 12}}},
		{in: "15min:4", want: Grid{{15 * time.Minute, 4}}},
		{in: " 1h:24 , 1d:7 ", want: Grid{{hour, 24}, {day, 7}}, canonical: "1h:24,1d:7"},
		{in: "24h:7,1y:2", want: Grid{{day, 7}, {365 * day, 2}}, canonical: "1d:7,1y:2"},
		{in: "60min:2", want: Grid{{hour, 2}}, canonical: "1h:2"},
		{in: "1d:14,1h:24", want: Grid{{hour, 24}, {day, 14}}, canonical: "1h:24,1d:14"},
	} {
		g, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if g.String() != strings.Join(strings.Fields(tt.in), "") && tt.canonical == "" {
			t.Errorf("Parse(%q).String() = %q", tt.in, g.String())
		}
		if tt.canonical != "" && g.String() != tt.canonical {
			t.Errorf("Parse(%q).String() = %q, want %q", tt.in, g.String(), tt.canonical)
		}
		if len(g) != len(tt.want) {
			t.Errorf("Parse(%q) = %v, want %v", tt.in, g, tt.want)
			continue
		}
		for i := range g {
			if g[i] != tt.want[i] {
				t.Errorf("Parse(%q) = %v, want %v", tt.in, g, tt.want)
			}
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tt := range []struct{ in, mention string }{
		{"", "empty"},
		{"1h", "EVERY:COUNT"},
		{"1h:0", "at least 1"},
		{"1h:x", "whole number"},
		{"h:24", "whole number and a unit"},
		{"1hour:24", "no known unit"},
		{"1s:24", "no known unit"},
		{"0h:24", "1 to 1000"},
		{"1d:14,24h:3", "same interval"},
		{"1h:24,", "EVERY:COUNT"},
		{"1h:600,1d:401", "more than 1000"},
		{"-1h:3", "whole number and a unit"},
		// 1000 years overflow a time.Duration; any span beyond 100 is
		// refused before its interval is multiplied.
		{"1000y:1", "more than 100 years"},
		{"101y:1", "more than 100 years"},
		{"1y:101", "more than 100 years"},
		{"1000w:1000", "more than 100 years"},
	} {
		_, err := Parse(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("Parse(%q) = %v, want an error mentioning %q", tt.in, err, tt.mention)
		}
	}
}

func TestHorizon(t *testing.T) {
	g, _ := Parse("1h:24,1d:14")
	if got, want := g.Horizon(), 14*day; got != want {
		t.Errorf("Horizon = %s, want %s", got, want)
	}
}

func TestKeep(t *testing.T) {
	// base is on the hour and at midnight UTC: blocks start there.
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		grid string
		// ages before base+after of the backups
		after time.Duration
		ages  []time.Duration
		want  []bool
	}{
		{"none", "1h:2", 0, nil, []bool{}},
		{"the newest alone, always kept", "1h:1", 0, []time.Duration{0}, []bool{true}},
		{"one a block: all kept", "1h:3", 0, []time.Duration{0, hour, 2 * hour}, []bool{true, true, true}},
		{"the first of a block is kept, with the newest", "1h:2", 30 * time.Minute,
			// at 0:30 (newest), 0:15, 0:00 (first of its hour), 23:20, 22:40 (first of its hour, the window's other block)
			[]time.Duration{0, 15 * time.Minute, 30 * time.Minute, 70 * time.Minute, 110 * time.Minute},
			[]bool{true, false, true, true, false}},
		{"beyond the window", "1h:2", 0, []time.Duration{0, 2 * hour, 30 * hour}, []bool{true, false, false}},
		{"spans keep apart, a backup kept by either", "1h:2,1d:2", 0,
			// at 0:00 (the newest, the first of its hour and day), 22:30,
			// 21:00, 4:00 (the first of the day before), 23:00 and 21:00
			// two days before, and 22:00 three days before
			[]time.Duration{0, 90 * time.Minute, 3 * hour, 20 * hour, 25 * hour, 27 * hour, 50 * hour},
			[]bool{true, false, false, true, false, false, false}},
		{"a block's first is kept as the window moves on", "1h:2", 90 * time.Minute,
			// at 1:30 (the newest), 1:10 (the first of its hour), 0:05 (the first of the hour before)
			[]time.Duration{0, 20 * time.Minute, 85 * time.Minute},
			[]bool{true, true, true}},
		{"order does not matter", "1h:2", 30 * time.Minute,
			[]time.Duration{110 * time.Minute, 15 * time.Minute, 0, 30 * time.Minute},
			[]bool{false, false, true, true}},
		{"backups of one instant share a verdict", "1h:2", 30 * time.Minute,
			[]time.Duration{0, 0, 10 * time.Minute, 30 * time.Minute, 30 * time.Minute},
			[]bool{true, true, false, true, true}},
	} {
		g, err := Parse(tt.grid)
		if err != nil {
			t.Fatal(err)
		}
		times := make([]time.Time, len(tt.ages))
		for i, a := range tt.ages {
			times[i] = base.Add(tt.after - a)
		}
		got := g.Keep(times)
		if len(got) != len(tt.want) {
			t.Errorf("%s: Keep = %v, want %v", tt.name, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: Keep = %v, want %v", tt.name, got, tt.want)
				break
			}
		}
	}
}

// TestKeepAsTimePasses backs a volume up on a schedule with jitter and
// missed runs for longer than the grid's horizon, prunes after every
// backup, and checks the grid's rules against every backup ever taken:
// the newest kept; of every block in a span's window, the first backup
// ever taken in it kept; nothing else kept; pruning again removing
// nothing.
func TestKeepAsTimePasses(t *testing.T) {
	for _, tt := range []struct {
		grid  string
		every time.Duration
		span  time.Duration
	}{
		{"1h:24,1d:14,1w:8,1m:12", hour, 400 * day},
		{"1h:24,1d:14,1w:8,1m:12", 10 * time.Minute, 40 * day},
		{"15min:8,1h:24,1d:7", 5 * time.Minute, 10 * day},
		{"1d:7", 3 * hour, 30 * day},
		{"1h:4", 3 * hour, 5 * day}, // blocks finer than the schedule
	} {
		g, err := Parse(tt.grid)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		start := time.Date(2026, 1, 1, 0, 7, 0, 0, time.UTC)
		h := newHistory(g)
		var kept []time.Time
		for now := start; now.Sub(start) < tt.span; now = now.Add(tt.every) {
			if rng.IntN(10) == 0 {
				continue // a missed run
			}
			backup := now.Add(time.Duration(rng.Int64N(int64(tt.every / 4))))
			h.take(backup)
			kept = append(kept, backup)
			keep := g.Keep(kept)
			next := kept[:0:0]
			for i, k := range keep {
				if k {
					next = append(next, kept[i])
				}
			}
			kept = next
			if err := h.check(kept); err != nil {
				t.Fatalf("%s, a backup every %s: after the backup at %s: %v", tt.grid, tt.every, backup, err)
			}
		}
		t.Logf("%s, a backup every %s for %s: %d kept, reaching back %s", tt.grid, tt.every, tt.span, len(kept), kept[len(kept)-1].Sub(kept[0]))
	}
}

// history is every backup taken, as the grid's rules need it: the first
// backup of each block of each span, by the block's start in Unix
// seconds, worked out apart from Keep's arithmetic.
type history struct {
	g      Grid
	newest time.Time
	first  []map[int64]time.Time // by span
}

func newHistory(g Grid) *history {
	h := &history{g: g}
	for range g {
		h.first = append(h.first, map[int64]time.Time{})
	}
	return h
}

func blockStart(t time.Time, every time.Duration) int64 {
	secs := int64(every / time.Second)
	return t.Unix() / secs * secs
}

// take records a backup newer than every one before it.
func (h *history) take(t time.Time) {
	h.newest = t
	for i, s := range h.g {
		if _, ok := h.first[i][blockStart(t, s.Every)]; !ok {
			h.first[i][blockStart(t, s.Every)] = t
		}
	}
}

// check says whether kept, in the order taken, is what the rules keep.
func (h *history) check(kept []time.Time) error {
	want := []time.Time{h.newest}
	for i, s := range h.g {
		secs := int64(s.Every / time.Second)
		last := blockStart(h.newest, s.Every)
		for b := last - int64(s.Count-1)*secs; b <= last; b += secs {
			if f, ok := h.first[i][b]; ok {
				want = append(want, f)
			}
		}
	}
	slices.SortFunc(want, time.Time.Compare)
	want = slices.CompactFunc(want, time.Time.Equal)
	if !slices.EqualFunc(kept, want, time.Time.Equal) {
		return fmt.Errorf("kept %d backups, the grid's rules keep %d:\nkept %v\nwant %v", len(kept), len(want), kept, want)
	}
	for i, k := range h.g.Keep(kept) {
		if !k {
			return fmt.Errorf("pruning again drops the backup at %s", kept[i])
		}
	}
	if oldest := h.newest.Sub(kept[0]); oldest >= h.g.Horizon() {
		return fmt.Errorf("kept a backup %s older than the newest, beyond the horizon %s", oldest, h.g.Horizon())
	}
	return nil
}
