package redisdb

import (
	"runtime"
	"sync"
	"time"
)

// A post on the global timeline gives every subscriber of its channel
// something to deliver at the same moment: thousands of goroutines, each
// of which marshals the event and writes it to a socket. Started all at
// once they fill Go's run queue, and a goroutine of the home timelines'
// path that waits on Redis meanwhile (the fan-out job between its round
// trips, the pub/sub reader, a home channel reading its timeline) joins
// the end of that queue when its answer comes, so the home subscribers
// get their post only once the whole burst is written.
//
// So a channel delivers in waves (deliveries): at most waveWidth
// goroutines at a time, each of which delivers one subscriber's queue,
// yields, and takes the next subscriber waiting; with the run queue that
// short, what else is runnable gets its turn during a burst. The wave is
// the channel's own, never the hub's: a burst on one channel does not
// hold up another channel's deliveries.
//
// A client that stops reading stalls its delivery until the transport's
// write timeout. A delivery that has not ended waveSlow after it started
// therefore leaves the wave: its goroutine goes on with it alone and
// another starts in its place, so stalled clients cannot hold up the
// others of their channel for longer than that. A subscriber is delivered
// by one goroutine at a time, from its own queue in order, as before;
// an idle subscriber still has no goroutine, and a channel without a
// burst costs one small struct.

// Bounds of a channel's waves.
var (
	// waveWidth is the most deliveries of one channel that run at once,
	// not counting those that left their wave. A goroutine readied during
	// a burst waits behind about waveWidth/GOMAXPROCS deliveries per CPU,
	// well under a millisecond at 32 (a delivery is some 20 µs of CPU).
	// Fewer keep the CPUs less busy: at 4 per CPU the global subscribers'
	// p99 was higher and swung more (BENCHMARKS.md, "Waves, and a home
	// channel that reads less").
	waveWidth = 32 * runtime.GOMAXPROCS(0)
	// waveSlow is how long a delivery runs before it leaves its wave.
	waveSlow = 5 * time.Millisecond
)

// deliveries is a channel's schedule of deliver goroutines (see above).
type deliveries struct {
	mu      sync.Mutex
	waiting []*subscriber // subscribers with events to deliver and no goroutine yet, in arrival order
	crew    []*deliverer  // the goroutines that count against the wave
	timer   *time.Timer   // runs check while subscribers wait; nil until the first wait
	armed   bool          // timer is set to fire
}

// deliverer is one goroutine of a wave.
type deliverer struct {
	since time.Time // when it began its current subscriber
	alone bool      // it left the wave: it ends with its current subscriber
}

// start has s's events delivered: on a goroutine of its own when the wave
// has room, else by the first goroutine of the wave that is free. The
// caller has marked s running, so s is not started twice.
func (d *deliveries) start(s *subscriber) {
	d.mu.Lock()
	if len(d.crew) >= waveWidth {
		d.waiting = append(d.waiting, s)
		if !d.armed {
			d.armed = true
			if d.timer == nil {
				d.timer = time.AfterFunc(waveSlow, d.check)
			} else {
				d.timer.Reset(waveSlow)
			}
		}
		d.mu.Unlock()
		return
	}
	w := &deliverer{since: time.Now()}
	d.crew = append(d.crew, w)
	d.mu.Unlock()
	go d.work(w, s)
}

// work delivers s, and then the subscribers waiting, one after another,
// until none waits or w left the wave.
func (d *deliveries) work(w *deliverer, s *subscriber) {
	for {
		s.deliver()
		if s = d.next(w); s == nil {
			return
		}
		// To the end of the run queue: a goroutine readied during the
		// burst runs before this wave's next delivery does.
		runtime.Gosched()
	}
}

// next hands w the next subscriber waiting, or takes w off the wave and
// returns nil.
func (d *deliveries) next(w *deliverer) *subscriber {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.alone {
		return nil // check took it off
	}
	if len(d.waiting) == 0 {
		d.leave(w)
		return nil
	}
	s := d.waiting[0]
	d.waiting[0] = nil
	d.waiting = d.waiting[1:]
	if len(d.waiting) == 0 {
		d.waiting = nil // a burst may have grown it large
	}
	w.since = time.Now()
	return s
}

// leave takes w off the crew. Callers hold mu.
func (d *deliveries) leave(w *deliverer) {
	for i, c := range d.crew {
		if c == w {
			last := len(d.crew) - 1
			d.crew[i] = d.crew[last]
			d.crew[last] = nil
			d.crew = d.crew[:last]
			return
		}
	}
}

// check runs while subscribers wait: every delivery of the wave that began
// waveSlow ago or more leaves it, and a new goroutine starts in its place
// for a subscriber waiting.
func (d *deliveries) check() {
	type job struct {
		w *deliverer
		s *subscriber
	}
	var jobs []job
	d.mu.Lock()
	now := time.Now()
	for i := 0; i < len(d.crew); {
		if w := d.crew[i]; now.Sub(w.since) >= waveSlow {
			w.alone = true
			d.leave(w) // moves the last one to i
			continue
		}
		i++
	}
	for len(d.crew) < waveWidth && len(d.waiting) > 0 {
		s := d.waiting[0]
		d.waiting[0] = nil
		d.waiting = d.waiting[1:]
		w := &deliverer{since: now}
		d.crew = append(d.crew, w)
		jobs = append(jobs, job{w, s})
	}
	if len(d.waiting) == 0 {
		d.waiting = nil
	}
	d.armed = len(d.waiting) > 0
	if d.armed {
		d.timer.Reset(waveSlow)
	}
	d.mu.Unlock()
	for _, j := range jobs {
		go d.work(j.w, j.s)
	}
}
