"""Third-party ACP agents the daemon is tested against."""
