package zfscmd

import "testing"

func TestParsePoolSpace(t *testing.T) {
	tests := []struct {
		out     string
		want    PoolSpace
		wantErr bool
	}{
		{out: "4227858432\t1153024\t4226705408\n", want: PoolSpace{Size: 4227858432, Allocated: 1153024, Free: 4226705408}},
		{out: "100\t0\t100", want: PoolSpace{Size: 100, Free: 100}},
		{out: "", wantErr: true},
		{out: "100\t0\n", wantErr: true},
		{out: "4G\t1M\t3G\n", wantErr: true}, // without -p
		{out: "1\t2\t3\t4\n", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parsePoolSpace(tt.out)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parsePoolSpace(%q) = %+v, %v; want %+v, error %v", tt.out, got, err, tt.want, tt.wantErr)
		}
	}
}
