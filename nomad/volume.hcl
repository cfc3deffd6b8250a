# A replicated, migratable volume:
#
#   nomad volume create volume.hcl
#
# The controller picks the client with the most room (or the one named by
# the "node" parameter) and keeps `replicas` copies on other clients of the
# same domain. When Nomad moves the job that uses it (drain, reschedule),
# ControllerPublish moves the data to the job's new client first.
id        = "web-data"
name      = "web-data"
type      = "csi"
plugin_id = "zfs-nomad"

# The ZFS quota (refquota by default): within the operator's max_quota.
capacity_min = "1GiB"
capacity_max = "2GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

parameters {
  # ZFS properties, only those the operator allows (-allow-property /
  # allow_properties in zfs-node.nomad.hcl).
  compression = "zstd"
  atime       = "off"

  # Copies on other clients, within the operator's max_replicas.
  replicas = "1"
  # Replicas are at most this old, within min_replication_interval.
  replication_interval = "5m"
  # When the client holding the volume is lost: "manual" (an operator runs
  # `zfs-controller promote`) or "auto" (the freshest replica is promoted
  # at once: writes newer than it are lost).
  failover = "manual"

  # The root directory's owner, group and mode, within the operator's
  # root_uids and root_gids (zfs-node.nomad.hcl): the example job's task
  # runs as nobody:nogroup (65534 on Debian and in busybox), not root.
  # Kept through moves, failovers and restores from snapshots.
  uid  = "65534"
  gid  = "65534"
  mode = "0750"

  # node   = "client-1" # create it on this client
  # pinned = "true"     # never move it: the job follows the data instead

  # Encrypted at rest, on every client that holds a copy; the key is loaded
  # only where the volume is mounted (docs/security.md, "Encrypted volumes").
  # encryption = "on"
}

# Secrets, which Nomad sends with the create and with every call on the
# volume after it:
# - owner_secret: only calls that present it reach the volume. Nomad does
#   not tell the driver a volume's namespace, so without one a volume of
#   the same name created in another namespace is this one, and anyone
#   who may register volumes can register this one's ID in theirs
#   (docs/volumes.md, "Owner secrets"). At least 16 random characters
#   (`openssl rand -hex 16`), one per team, never shared.
# - encryption_key: with encryption = "on", the passphrase. Keep it:
#   without it the data cannot be read.
# secrets {
#   owner_secret   = "the output of openssl rand -hex 16"
#   encryption_key = "a passphrase of 8 to 512 characters"
# }

mount_options {
  mount_flags = ["noatime"]
}
