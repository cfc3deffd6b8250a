# nomad volume create nomad/volume.hcl
id        = "web-data"
name      = "web-data"
type      = "csi"
plugin_id = "zfs-nomad"

capacity_min = "1GiB"
capacity_max = "2GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# ZFS properties the operator allows (-allow-property on the nodes).
# "node" pins the volume to a client; leave it out to let the controller
# choose the client with most room.
parameters {
  compression          = "zstd"
  replicas             = "1"   # copies on other clients, within the operator's max_replicas
  replication_interval = "5m"  # at most this old, within min_replication_interval
}

mount_options {
  mount_flags = ["noatime"]
}
