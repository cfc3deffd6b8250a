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
  compression = "zstd"
}

mount_options {
  mount_flags = ["noatime"]
}
