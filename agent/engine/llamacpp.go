package engine

import "strconv"

// planLlamaCpp builds llama-server's argv (design §6). llama.cpp cannot load
// adapters at run time the way vLLM does, so every adapter is loaded at start
// and left unapplied until a request names it.
//
// llama.cpp's parser knows no "--opt=value" form; it takes the item after an
// option as that option's value whatever it looks like, so the model path
// and the adapters' paths, each given after its option, cannot become
// options. It has no positional argument; extra_args must still start with
// an option (checkExtraArgs).
func planLlamaCpp(s Spec) (Launch, error) {
	if err := checkListen(s); err != nil {
		return Launch{}, err
	}
	if err := checkExtraArgs(s.Model); err != nil {
		return Launch{}, err
	}
	m := s.Model
	addr, health := httpAddr(s)
	argv := command(s, []string{"llama-server"})
	argv = append(argv, "-m", m.GetModel(),
		"--host", s.Host,
		"--port", strconv.Itoa(s.Port),
		"--alias", m.GetName(),
		"--metrics")
	if ads := m.GetAdapters(); len(ads) > 0 {
		for _, a := range ads {
			argv = append(argv, "--lora", a.GetPath())
		}
		argv = append(argv, "--lora-init-without-apply")
	}
	argv = append(argv, m.GetExtraArgs()...)
	return Launch{Argv: argv, Env: commonEnv(s, nil), Address: addr, HealthURL: health}, nil
}
