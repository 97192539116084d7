"""Start-up hooks of ``distify verify``'s runs: this folder goes on their ``PYTHONPATH`` (a
package only so that it ships with distify)."""
