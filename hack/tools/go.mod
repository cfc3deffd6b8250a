module github.com/zfs-nomad/zfs-nomad/hack/tools

go 1.25.0

require (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.0
	google.golang.org/protobuf v1.36.12
	honnef.co/go/tools v0.7.0
)

require (
	github.com/BurntSushi/toml v1.4.1-0.20240526193622-a339e1f7089c // indirect
	golang.org/x/exp/typeparams v0.0.0-20231108232855-2478ac86f678 // indirect
	golang.org/x/mod v0.31.0 // indirect
	golang.org/x/sync v0.19.0 // indirect
	golang.org/x/tools v0.40.1-0.20260108161641-ca281cf95054 // indirect
)
