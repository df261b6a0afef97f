// Package fence keeps a serving node that failed halfway from serving
// beside its successor. It has two tools, one for each side of a
// failover.
//
// # The node's own side: a watchdog
//
// [Watchdog] holds the Linux watchdog device (/dev/watchdog): a timer in
// the kernel or in hardware that resets the machine unless it is pinged in
// time. The contract it serves:
//
//   - A node arms the watchdog ([Watchdog.Arm]) before it serves.
//   - It feeds it ([Watchdog.FeedWithin]) only when it holds proof that it
//     may serve (a valid lease, a quorum's answer). Each feed moves the
//     reset deadline to the feed's time plus the timeout. A ping lands
//     when its ioctl returns at the latest, so the proof is asked again
//     then: a ping that returned after the proof ended starves the
//     watchdog at once towards that end plus the timeout.
//   - While it cannot prove it may serve, it starves the watchdog
//     ([Watchdog.Starve]) instead of feeding it. Starving never moves the
//     deadline later than D, the last feed's time plus the timeout (or
//     D + 1 s when the deadline is less than a second away: the device
//     counts in whole seconds). That holds even if the process dies while
//     starving, although the kernel pings the watchdog once when its holder
//     dies: Starve shrinks the device timeout as D nears, so that the ping
//     of a death resets the machine no later than D + 1 s + one Starve
//     interval.
//   - A process that dies while fed leaves the watchdog running; the
//     kernel's ping at the death moves the deadline to the death plus the
//     timeout, so at most one feed interval past D.
//   - So a successor that waits, from the last moment the node could have
//     fed the watchdog (the end of its last proof), for the timeout plus
//     one feed or Starve interval plus 1 s, and a margin for the rates of
//     the two clocks, knows that the node has been reset, whether its
//     process lived, hung, or died.
//   - A process that finds the watchdog left running by a predecessor that
//     died does not feed it: [OpenDevice] refuses the device
//     ([ErrLeftRunning]), and the machine resets when it expires.
//   - It never opens a watchdog whose sysfs says nowayout ([ErrNoWayOut]:
//     it could never be disarmed), nor one another process holds
//     ([ErrHeldByOther]); releasing at start opens none that is not
//     running ([ErrNotRunning]).
//   - It disarms ([Watchdog.Disarm]) only after it stopped serving. When
//     stopping fails, [Watchdog.ResetSoon] makes the machine reset within
//     a second rather than keep serving.
//
// # The successor's side: a fence agent
//
// [Agent] runs a ClusterLabs fence agent (fence_ipmilan, fence_virsh,
// fence_aws, fence_scsi, …) against the failed node: the agent reads
// key=value lines on its standard input and exits 0 on success. A success
// of action=off means the agent saw the target powered off (agents built
// on the fence-agents library poll the power state after switching it off
// and fail if it does not turn off in time), or, for fabric agents such as
// fence_scsi, cut off from its storage: either way the node can no longer
// serve or write. Anything but exit 0 is not a success, a hung agent is
// killed at its timeout, and [Agent.Fence] retries until it succeeds or
// its context ends.
package fence
