package mysqltest

// Stop stops the server the test binary's tests shared, if they started
// one, and removes its files. Main calls it; a package whose TestMain runs
// another helper's Main (redistest.Main) passes it there instead.
func Stop() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server != nil {
		shared.server.stop()
		shared.server = nil
	}
}
