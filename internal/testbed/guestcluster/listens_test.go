package guestcluster

import "testing"

func TestListens(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100000A:1DF6 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100000A:25C6 0200000A:1DF6 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
`
	for _, tt := range []struct {
		port string
		want bool
	}{
		{":1DF6 ", true},  // 7670, listening
		{":25C6 ", false}, // 9670: only a connection's local end
		{":1E1E ", false},
	} {
		if got := listens(table, tt.port); got != tt.want {
			t.Errorf("listens(%q) = %v, want %v", tt.port, got, tt.want)
		}
	}
}
